// loom's ring algorithms on point-to-point messages (DESIGN.md §2 comm).
//
// Chunk c of an n-element buffer is shard_range(n, size, c), so the results
// match the MPI algorithm's reduce_scatter / all_gather layout. Each step's
// chunk is cut into pieces of at most RingConfig::piece_bytes, and a piece
// is forwarded as soon as it has arrived (and been reduced): the reduction
// of piece i overlaps the transfer of piece i + 1, and the next step's
// transfer starts before this step has finished.
//
// Costs per rank for n elements over p ranks: reduce-scatter and all-gather
// send (p-1)/p·n elements each, all-reduce 2(p-1)/p·n (bandwidth-optimal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/p2p.h"
#include "core/dtype.h"

namespace loom::comm {

struct RingConfig {
  // Measured on the 2-core dev machine (BENCHMARKS.md, loom bench comm).
  size_t piece_bytes = size_t{256} << 10;
};

// After it, chunk p2p.rank() of buf (n elements of f32, i32 or i64) holds op
// over ranks of that chunk; other chunks hold partial results. avg reduces
// as sum (the caller divides). scratch is resized as needed and reused.
void ring_reduce_scatter(P2p& p2p, void* buf, int64_t n, DType dtype, ReduceOp op,
                         std::vector<std::byte>& scratch, const RingConfig& cfg = {});
// Every chunk of buf (n elements of elem_bytes each) <- the chunk of the rank
// that holds it; chunk p2p.rank() is the input.
void ring_all_gather(P2p& p2p, void* buf, int64_t n, size_t elem_bytes, const RingConfig& cfg = {});
// buf <- op over ranks of buf: reduce-scatter then all-gather, in place.
void ring_all_reduce(P2p& p2p, void* buf, int64_t n, DType dtype, ReduceOp op,
                     std::vector<std::byte>& scratch, const RingConfig& cfg = {});

}  // namespace loom::comm
