// The pure layout of data parallelism (parallel/dp.h): which parameter group
// each parameter belongs to, the group's index space, its buckets, a rank's
// shard segments and their pieces. Nothing here communicates or allocates a
// tensor; everything is unit-tested without ranks (tests/parallel/test_dp_*).
//
// A parameter group's index space packs its parameters in flat order (the
// model's spec order), so a group whose parameters are spread over the flat
// buffer — expert weights inside each layer's unit, or the layer norms —
// is bucketed and sharded as one contiguous range. The group of every
// parameter has index == flat element; another group maps each index range to
// one or more runs of the flat buffer (GroupSpace::runs).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/model.h"

namespace loom::parallel {

// ---- parameter groups ----

// Which parameters a group holds.
using ParamPredicate = std::function<bool(const model::ParamSpec&)>;
// Holds exactly the parameters named (names the model lacks hold nothing: a
// pipeline stage has only some of a model's parameters).
ParamPredicate params_named(std::vector<std::string> names);
// Holds every parameter.
ParamPredicate all_params();

// The names of the parameter groups loom makes (checkpoints record them):
// the default group of every parameter, or under expert parallelism of
// every parameter but the experts, and an ep rank's experts
// (model::is_expert_param), the group they are in exactly when ep > 1.
inline constexpr const char* kDenseGroup = "dense";
inline constexpr const char* kExpertGroup = "experts";
inline bool in_expert_group(const std::string& param, int ep) { return ep > 1 && model::is_expert_param(param); }

// A set of whole parameters whose gradients are averaged over `comm` and
// whose optimizer state (and, from ZeRO stage 2, gradients; 3, parameters)
// is sharded over it: the dense parameters over the dp (x cp) group, a MoE
// model's experts under ep over mesh.expert_dp_cp() (train/rank_chunks.cpp).
struct ParamGroup {
  std::string name;
  std::reference_wrapper<comm::Communicator> comm;
  ParamPredicate holds;
  // The ranks that hold other parameters of this group (the ep group, each
  // holding its own experts), over which the gradient norm sums it too;
  // null: every rank of comm holds them all.
  comm::Communicator* spread = nullptr;
};

// Pure: the group (an index into groups) of every spec. A parameter no group
// holds, or two do, is a loom::Error naming it and the groups; so are no
// groups, a group without a predicate and two groups of one name.
std::vector<int> assign_param_groups(const std::vector<model::ParamSpec>& specs, const std::vector<ParamGroup>& groups);

// Pure: from ZeRO stage 2 the model borrows a unit's gradients (3: also its
// parameters) from one group's bucket, so every unit's parameters must lie
// in one group; a unit split between two is a loom::Error naming a
// parameter of each and the groups.
void require_whole_units(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
                         const std::vector<int>& group_of, const std::vector<ParamGroup>& groups, int zero_stage);

// One group's parameters packed in flat order.
struct GroupSpace {
  // Runs of consecutive group indices that are also consecutive in the flat
  // buffer, in order: index [index, index + count) is flat [flat, flat + count).
  struct Run {
    int64_t index = 0, flat = 0, count = 0;
  };
  std::vector<model::ParamSpec> specs;  // the group's, offset = its first index
  std::vector<int64_t> flat;            // per spec: its offset in the flat buffer
  std::vector<model::Unit> units;       // per model unit: its group indices (empty when it has none)
  std::vector<Run> runs;
  int64_t numel = 0;
};
// Pure: group `group`'s space; group_of from assign_param_groups, units the
// model's (model.h), specs packed in offset order.
GroupSpace group_space(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
                       const std::vector<int>& group_of, int group);

// Calls f(flat, at, n) for the flat runs holding group indices
// [index, index + count) in order: at is the run's place in that range.
template <typename F>
void for_each_flat_run(const GroupSpace& s, int64_t index, int64_t count, F f) {
  const auto first = std::partition_point(s.runs.begin(), s.runs.end(),
                                          [&](const GroupSpace::Run& r) { return r.index + r.count <= index; });
  for (auto it = first; it != s.runs.end() && it->index < index + count; ++it) {
    const int64_t lo = std::max(index, it->index), hi = std::min(index + count, it->index + it->count);
    if (lo < hi) f(it->flat + (lo - it->index), lo - index, hi - lo);
  }
}
// Whether group indices [index, index + count) are one flat run.
bool is_one_run(const GroupSpace& s, int64_t index, int64_t count);

// Calls f(spec, lo, hi) for every spec overlapping elements [begin, end) of
// specs' offsets, with the overlap [lo, hi), in offset order: specs packed in
// offset order, found by binary search, so a loop over buckets or segments
// stays linear in the parameters.
template <typename F>
void for_each_overlap(const std::vector<model::ParamSpec>& specs, int64_t begin, int64_t end, F f) {
  auto it = std::partition_point(specs.begin(), specs.end(),
                                 [&](const model::ParamSpec& p) { return p.offset + p.numel() <= begin; });
  for (; it != specs.end() && it->offset < end; ++it) {
    const int64_t lo = std::max(begin, it->offset), hi = std::min(end, it->offset + it->numel());
    if (lo < hi) f(*it, lo, hi);
  }
}

// ---- buckets, segments, pieces (in a group's index space) ----

// Units [first_unit, last_unit] (model.h), elements [begin, end).
struct Bucket {
  int first_unit = 0, last_unit = 0;
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};
// Pure: the buckets of a group's units (GroupSpace::units; for the group of
// every parameter the model's units) under a stage (parallel/dp.h), in order.
// Units without elements belong to no bucket. solo: element ranges (stages 0
// and 1), each inside one unit, cut out of the bucket holding them as
// buckets of their own; such a bucket, and the rest of a unit cut in two,
// finish with the unit (a bucket finishes when backward finishes its lowest
// unit).
std::vector<Bucket> make_buckets(const std::vector<model::Unit>& units, int zero_stage, double bucket_mb,
                                 const std::vector<model::Unit>& solo = {});
// Pure: the element ranges of the named parameters the group holds (in its
// index space), the `solo` make_buckets cuts out; names it lacks are skipped.
std::vector<model::Unit> solo_ranges(const GroupSpace& space, const std::vector<std::string>& names);

// One piece of a rank's shard: elements [offset, offset + count) of the
// group's index space, at shard_offset in the rank's packed shard buffers.
struct Segment {
  int64_t offset = 0, count = 0, shard_offset = 0;
};
// Pure: rank's shard under a stage (stage 0: every bucket whole), one
// segment per bucket, packed in bucket order.
std::vector<Segment> shard_segments(const std::vector<Bucket>& buckets, int zero_stage, int size, int rank);

// A run of a segment inside one parameter: AdamW's weight decay is per
// tensor (2-D weights decay).
struct ParamPiece {
  int64_t offset = 0, count = 0, shard_offset = 0;
  bool decay = false;
};
// Pure: the segments cut at parameter boundaries, in order; offset in the
// specs' (and segments') space. specs packed in offset order.
std::vector<ParamPiece> segment_pieces(const std::vector<Segment>& segments,
                                       const std::vector<model::ParamSpec>& specs);
// Pure: segment_pieces of a group's segments with offset the flat element
// (a piece lies inside one parameter, so inside one flat run).
std::vector<ParamPiece> group_pieces(const std::vector<Segment>& segments, const GroupSpace& space);

// ZeRO 2 and 3: the gradient reductions a rank keeps in flight; when one
// more starts, the oldest is waited for (DataParallel::grads_ready).
inline constexpr size_t kMaxReductionsInFlight = 2;

// One parameter group of a rank as zero_comm_peak sees it: its buckets
// (over the group's units: GroupSpace::units), the rank's segments and the
// group's ranks. It refers to the vectors: they must outlive it (build them
// first, never pass temporaries).
struct ZeroGroup {
  const std::vector<Bucket>& buckets;
  const std::vector<Segment>& segments;
  int size = 1;
  // ZeRO 0 and 1: per bucket, the bytes of the f32 copy its reduction packs
  // (a bucket spread over the flat buffer; 0 in place), held from the last
  // micro-batch's backward finishing it until the step waits for the
  // gradients (dp_grads.cpp reduce_bucket). Empty: none.
  const std::vector<int64_t>& packed = kNoPacked;
  static inline const std::vector<int64_t> kNoPacked{};
};

// Pure: the most bytes DataParallel holds in pools[comm] over a step of
// `micro_batches` forward and backward passes under ZeRO stage 0 to 3
// (units: the model's; groups: its parameter groups, unit_group[u] the one
// unit u lies in; param_bytes: the compute dtype's size), from the model's
// hook calls (Model::hook_events):
//   stage 3  a unit's parameters gathered into a buffer at its
//            acquire_params, the pass's next unit prefetched, the buffer
//            freed when its last holder releases it (dp_zero3.cpp);
//   0 and 1  the last micro-batch's packed reductions (ZeroGroup::packed),
//            each started when its bucket's first unit is ready;
//   2 and 3  a bucket's f32 gradient buffer opened at its first unit's
//            acquire_grads; when its first unit is ready it is
//            reduce-scattered into an f32 piece of the rank's segment (size
//            1: added into the shard and freed), and when a third reduction
//            starts — of any group — the oldest is retired (dp_grads.cpp).
// `computing(unit, backward)`: bytes something else holds in pools[comm]
// while the unit computes (a context-parallel attention call's K and V in
// flight), added at each compute: after a unit's acquires, before its
// releases.
int64_t zero_comm_peak(const std::vector<model::HookEvent>& forward, const std::vector<model::HookEvent>& backward,
                       const std::vector<model::Unit>& units, const std::vector<ZeroGroup>& groups,
                       const std::vector<int>& unit_group, int zero_stage, int micro_batches, int64_t param_bytes,
                       const std::function<int64_t(int unit, bool backward)>& computing = {});

}  // namespace loom::parallel
