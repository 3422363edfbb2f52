// Resharding a checkpoint (train/checkpoint.h): from which saved file, at
// which offset, each element of a rank's new shard is read. Pure
// bookkeeping over plain data (parameter specs, flat segments): no files,
// no communication, no Trainer.
//
// A saved run held each pipeline stage's parameters per tp rank in one flat
// buffer (model::param_specs of the saved config for that stage and tp rank),
// cut into dp shards (segments of that buffer, packed). A new rank holds, per
// chunk, its own specs and its own dp segments. For each parameter of the
// chunk, plan_reads finds the saved stage that held that name (a last
// stage's copy of a tied embedding: stage 0's wte), maps the chunk's runs of
// global elements (model::shard_runs) to the saved tp rank that held them
// (replicated parameters: tp rank 0), then to the flat offset in that
// stage's and rank's buffer, then to the saved shard holding that offset.
// Vocabulary padding rows hold no global element and are not read.
//
//   SavedLayout saved;                      // saved.tp, saved.pp, saved.stages
//   add_saved_stage_specs(saved, specs);    // per stage: every tp rank's specs
//   add_saved_shard(saved, {stage, tp_rank, file, prefix, numel}, segments);
//   sort_saved_segments(saved);
//   const ReadPlan plan = plan_reads(chunk_specs, chunk_segments, saved);
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

// How the checkpoint's run held the parameters: its tp size, its pipeline
// stages (one without pipelining), every (stage, tp rank)'s specs
// (model::param_specs of the saved config), per (stage, tp rank) its shards'
// segments (in that stage's and tp rank's flat coordinates; file: index into
// `shards`), and which stage holds each parameter.
struct SavedLayout {
  struct Stage {
    int64_t first = 0, count = 0, numel = 0;
  };
  struct Shard {
    std::string file, prefix;  // tensors prefix + master, adam_m, adam_v of file
    int64_t numel = 0;
    int open = 0;  // index into `files`
  };
  int tp = 1, pp = 1;
  std::vector<Stage> stages;
  std::vector<std::vector<std::vector<model::ParamSpec>>> specs;  // [stage][tp rank][parameter]
  std::vector<Shard> shards;
  std::vector<std::string> files;                         // the shards' files, each once, in order of first use
  std::vector<std::vector<std::vector<Piece>>> segments;  // [stage][tp rank], sorted
  // Parameter name -> (stage, index in its specs); a later stage's copy of
  // the tied embedding is not one: its name leads to stage 0's.
  std::map<std::string, std::pair<int, size_t>> by_name;
};

// Appends the next saved stage's specs, [tp rank][parameter] (every tp
// rank's, in offset order), and indexes its parameters by name (a pp_copy is
// not indexed). A name already held by an earlier stage is a bug.
void add_saved_stage_specs(SavedLayout& s, std::vector<std::vector<model::ParamSpec>> ranks);

// One saved shard of a (stage, tp rank): its file, the tensors' prefix, its
// packed size.
struct SavedShardInfo {
  int64_t stage = 0;
  int tp_rank = 0;
  std::string file, prefix;
  int64_t numel = 0;
};
// Appends a shard and its segments ([offset, count, shard_offset] in its
// stage's and tp rank's flat coordinates) to those of its (stage, tp rank);
// the stage's specs must be added first. Returns the shard's index.
int add_saved_shard(SavedLayout& s, const SavedShardInfo& shard, const std::vector<parallel::Segment>& segments);

// Sorts every (stage, tp rank)'s segments by offset, once all shards are added.
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

// Where in the saved shards each element of one chunk's dp segments is
// (specs: the chunk's, this rank's tp rank and stage; mine: its dp segments,
// shard_offset into the packed shard). Reads contiguous in both the saved
// shard and the packed shard are merged. Every saved element a parameter
// needs must be covered by the saved segments (sort_saved_segments, and the
// manifest's checks that they cover each stage once).
ReadPlan plan_reads(const std::vector<model::ParamSpec>& specs, const std::vector<parallel::Segment>& mine,
                    const SavedLayout& saved);

}  // namespace loom::train
