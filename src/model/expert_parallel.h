// Expert parallelism as the model sees it (DESIGN.md §5 EP; GShard, Lepikhin
// et al. 2020; Megatron-Core's MoE token dispatcher): the ep ranks of a
// group each hold n_expert / ep experts of every MoE layer (params.h
// EpRank) and route their own tokens. A MoE layer sends each kept choice's
// row to the rank holding its expert, computes the rows its experts
// received, and sends the outputs back to be combined where the token lives
// (model/moe.h):
//
//   counts   all_to_all of each rank's rows per expert (E int64)
//   dispatch all_to_all_v of the rows, by destination rank
//   experts  grouped GEMMs over the received rows, ordered by local expert:
//            first the rank's own rows (taken from its send buffer, so they
//            run while the others travel), then the other ranks'
//   combine  all_to_all_v back (the reverse counts; the shared experts run
//            meanwhile), then the weighted sum
//
// backward mirrors it: the combine's gradient rows travel to the experts
// with the forward's counts (the rank's own rows' expert backward runs
// meanwhile), the input gradient rows back with the reverse (the shared
// experts' and the router's backward run meanwhile).
// Under tensor parallelism every tp rank routes the same tokens and its ep
// group is made of the ranks with its tp rank, so each expert's tp slices
// see the same rows.
#pragma once

#include <span>

#include "core/tensor.h"
#include "model/params.h"

namespace loom::model {

// The collectives over the ep group; parallel/ep.h implements them on a
// comm::Communicator.
class ExpertParallelOps {
 public:
  virtual ~ExpertParallelOps() = default;
  // in (E) i64: size() blocks of E / size(), block r for rank r; out (E):
  // block r is rank r's block for this rank. Blocking.
  virtual void exchange_counts(Tensor out, const Tensor& in) = 0;
  // Starts moving rows: rows of in, in rank blocks of send_rows[r] rows, go
  // to rank r; out gets rank r's in blocks of recv_rows[r] rows, in rank
  // order. in and out are (rows, width) of one dtype (f32, bf16 or f16),
  // their leading rows used, and must not be touched until finish_rows(),
  // which waits for it. One exchange at a time. Whether it returns at once
  // (the layer computes while the rows travel) or once the rows are there
  // (parallel.ep_overlap = false) is the implementation's choice; the layer
  // calls both at the same places either way, so both give the same bits.
  virtual void start_rows(Tensor out, std::span<const int64_t> recv_rows, const Tensor& in,
                          std::span<const int64_t> send_rows) = 0;
  virtual void finish_rows() = 0;
};

// Context parallelism cuts every sequence over the cp ranks, so a routing
// group's tokens (whole sequences, model/moe.h) are spread over them: its
// capacity drops and balancing statistics are decided over the cp group
// with these collectives (parallel/ep.h RoutingGroups). Blocking.
class RoutingGroupOps {
 public:
  virtual ~RoutingGroupOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out (size x n) <- every rank's in (n), in rank order; f32 or i32.
  virtual void all_gather(Tensor out, const Tensor& in) = 0;
  // In place: the sum over the ranks (f32).
  virtual void all_reduce_sum(Tensor t) = 0;
};

// How a Model's experts are split: its ep rank and group size, and the
// collectives (required for forward and backward when ep > 1; a model built
// only to count bytes may leave them null).
struct EpOptions {
  EpRank ep;
  ExpertParallelOps* ops = nullptr;
  bool active() const { return ep.size > 1; }
};

}  // namespace loom::model
