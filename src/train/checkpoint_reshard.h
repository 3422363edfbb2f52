// Resharding a checkpoint (train/checkpoint.h): from which saved file, at
// which offset, each element of a rank's new shard is read. Pure
// bookkeeping over plain data (parameter specs, flat segments): no files,
// no communication, no Trainer.
//
// A saved run held each pipeline stage's parameters per tp rank (and ep
// rank) in one flat buffer (model::param_specs of the saved config for that
// stage, tp rank and ep rank), split into parameter groups (one, or dense
// and experts under ep: checkpoint_groups), each group's space cut into dp
// shards (segments of that space, packed). A new rank holds, per chunk and
// group, its own specs and its own dp segments. For each parameter of a
// group, plan_reads finds the saved space that held that name (a last
// stage's copy of a tied embedding: stage 0's wte; an expert: its saved ep
// rank's), maps the group's runs of global elements (model::shard_runs) to
// the saved tp rank that held them (replicated parameters: tp rank 0), then
// to the offset in that space and rank, then to the saved shard holding
// that offset. Vocabulary padding rows hold no global element and are not
// read.
//
//   SavedLayout saved;                      // saved.tp, saved.pp, saved.ep, saved.stages
//   const int space = add_saved_space(saved, {stage, group, ep_rank, numel}, specs);  // every tp rank's
//   add_saved_shard(saved, {space, tp_rank, file, prefix, numel}, segments);
//   sort_saved_segments(saved);
//   const ReadPlan plan = plan_reads(group_specs, group_segments, saved);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/params.h"
#include "parallel/dp.h"

namespace loom::train {

// A flat range [offset, offset + count) that sits at shard_offset of a packed
// buffer: a saved shard's segment (file: which shard of SavedLayout), this
// rank's own segment, or a saved tp rank's parameter run (offset global,
// shard_offset its flat offset; file: the saved tp rank).
struct Piece {
  int64_t offset = 0, count = 0, shard_offset = 0;
  int file = -1;
};

// Drops the empty pieces and sorts the rest by offset.
void sort_pieces(std::vector<Piece>& pieces);

// dp segments as pieces (file: `file`), sorted.
std::vector<Piece> pieces_of(const std::vector<parallel::Segment>& segments, int file = -1);

// The parameter groups a (stage, ep rank)'s flat specs are saved in, as
// parallel::DataParallel lays them out (parallel/dp_layout.h): at ep = 1 one
// group "dense" of every parameter; under expert parallelism "dense" (every
// parameter but the experts, the same on every ep rank) and "experts" (the
// rank's own experts). Each group's specs are packed in flat order: offset =
// the parameter's first index in the group's space, the coordinates of its
// dp segments.
struct SavedGroup {
  std::string name;
  std::vector<model::ParamSpec> specs;
  std::vector<int64_t> flat;  // per spec: its offset in the flat buffer
};
std::vector<SavedGroup> checkpoint_groups(const std::vector<model::ParamSpec>& flat, int ep);

// How the checkpoint's run held the parameters: its tp, pp and ep sizes, its
// pipeline stages (one without pipelining), its spaces (per stage, each
// parameter group's index space: "dense" once, "experts" once per ep rank),
// every (space, tp rank)'s specs (checkpoint_groups of model::param_specs of
// the saved config), per (space, tp rank) its shards' segments (in that
// space's coordinates; file: index into `shards`), and which space holds
// each parameter.
struct SavedLayout {
  struct Stage {
    int64_t first = 0, count = 0, numel = 0;  // numel: one (tp rank, ep rank)'s flat elements
  };
  struct Space {
    int64_t stage = 0;
    std::string group;
    int ep_rank = 0;  // the experts' ep rank; 0 for "dense"
    int64_t numel = 0;
  };
  struct Shard {
    std::string file, prefix;  // tensors prefix + master, adam_m, adam_v of file
    int64_t numel = 0;
    int open = 0;  // index into `files`
  };
  int tp = 1, pp = 1, ep = 1;
  std::vector<Stage> stages;
  std::vector<Space> spaces;
  std::vector<std::vector<std::vector<model::ParamSpec>>> specs;  // [space][tp rank][parameter]
  std::vector<Shard> shards;
  std::vector<std::string> files;                         // the shards' files, each once, in order of first use
  std::vector<std::vector<std::vector<Piece>>> segments;  // [space][tp rank], sorted
  // Parameter name -> (space, index in its specs); a later stage's copy of
  // the tied embedding is not one: its name leads to stage 0's.
  std::map<std::string, std::pair<int, size_t>> by_name;
};

// The index of the space (stage, group, ep rank: ignored but for
// "experts"), or -1.
int find_saved_space(const SavedLayout& s, int64_t stage, const std::string& group, int ep_rank);

// Appends the next saved space and its specs, [tp rank][parameter] (every tp
// rank's, in offset order), and indexes its parameters by name (a pp_copy is
// not indexed). A name already held by an earlier space is a bug. Returns
// the space's index.
int add_saved_space(SavedLayout& s, SavedLayout::Space space, std::vector<std::vector<model::ParamSpec>> ranks);

// One saved shard of a (space, tp rank): its file, the tensors' prefix, its
// packed size.
struct SavedShardInfo {
  int space = 0;
  int tp_rank = 0;
  std::string file, prefix;
  int64_t numel = 0;
};
// Appends a shard and its segments ([offset, count, shard_offset] in its
// space's coordinates) to those of its (space, tp rank); the space must be
// added first. Returns the shard's index.
int add_saved_shard(SavedLayout& s, const SavedShardInfo& shard, const std::vector<parallel::Segment>& segments);

// Sorts every (space, tp rank)'s segments by offset, once all shards are added.
void sort_saved_segments(SavedLayout& s);

// One read: `count` elements at `src` of saved shard `shard` go to `dst` of
// this rank's packed shard.
struct Read {
  int shard = 0;
  int64_t src = 0, dst = 0, count = 0;
};

// The reads that fill one chunk's packed shard, and how many of its
// elements are vocabulary padding (not read: they are 0).
struct ReadPlan {
  std::vector<Read> reads;
  int64_t padding = 0;
};

// Where in the saved shards each element of one parameter group's dp
// segments is (specs: the group's, offsets in its space, of this rank's tp
// rank, stage and ep rank; mine: its dp segments in that space, shard_offset
// into the packed shard). Reads contiguous in both the saved
// shard and the packed shard are merged. Every saved element a parameter
// needs must be covered by the saved segments (sort_saved_segments, and the
// manifest's checks that they cover each stage once).
ReadPlan plan_reads(const std::vector<model::ParamSpec>& specs, const std::vector<parallel::Segment>& mine,
                    const SavedLayout& saved);

}  // namespace loom::train
