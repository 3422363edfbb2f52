#include "comm/ring.h"

#include <algorithm>

#include "comm/reduce.h"
#include "core/error.h"

namespace loom::comm {
namespace {

// Pieces of chunk c: both ends of a message compute the same split.
struct Pieces {
  Range chunk;
  int64_t piece = 1;  // elements per piece (the last one may be shorter)

  int64_t count() const { return chunk.count == 0 ? 0 : (chunk.count + piece - 1) / piece; }
  int64_t offset(int64_t i) const { return i * piece; }  // within the chunk
  int64_t length(int64_t i) const { return std::min(piece, chunk.count - i * piece); }
};

struct Ring {
  int rank, size, left, right;
  int64_t n;
  int64_t piece;

  Ring(const P2p& p2p, int64_t n_, size_t elem_bytes, const RingConfig& cfg)
      : rank(p2p.rank()), size(p2p.size()), left((rank + size - 1) % size), right((rank + 1) % size), n(n_),
        piece(std::max<int64_t>(1, static_cast<int64_t>(cfg.piece_bytes / elem_bytes))) {}
  Pieces pieces(int c) const { return Pieces{shard_range(n, size, ((c % size) + size) % size), piece}; }
};

}  // namespace

// Step s (0 <= s < p-1): rank r sends chunk r-s-1 to the right and receives
// chunk r-s-2 from the left, reducing it into its own copy; that reduced
// chunk is what it sends at step s+1, so after p-1 steps chunk r-p = r is
// complete. Receives of step s+1 are posted before step s is reduced, into
// the other half of scratch, so a fast left neighbour never waits for us.
void ring_reduce_scatter(P2p& p2p, void* buf, int64_t n, DType dtype, ReduceOp op,
                         std::vector<std::byte>& scratch, const RingConfig& cfg) {
  if (p2p.size() == 1 || n == 0) return;
  const size_t es = dtype_size(dtype);
  const Ring ring(p2p, n, es, cfg);
  const int steps = ring.size - 1;
  auto* data = static_cast<std::byte*>(buf);
  const int64_t max_chunk = shard_range(n, ring.size, 0).count;
  scratch.resize(2 * static_cast<size_t>(max_chunk) * es);
  std::byte* half[2] = {scratch.data(), scratch.data() + max_chunk * es};

  auto post_recvs = [&](int s, std::vector<int>& handles) {
    const Pieces ps = ring.pieces(ring.rank - s - 2);
    handles.clear();
    for (int64_t i = 0; i < ps.count(); ++i)
      handles.push_back(p2p.irecv(half[s % 2] + ps.offset(i) * es, ps.length(i) * es, ring.left));
  };
  const Pieces first = ring.pieces(ring.rank - 1);
  for (int64_t i = 0; i < first.count(); ++i)
    p2p.isend(data + (first.chunk.offset + first.offset(i)) * es, first.length(i) * es, ring.right);
  std::vector<int> cur, next;
  post_recvs(0, cur);
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_recvs(s + 1, next);
    const Pieces ps = ring.pieces(ring.rank - s - 2);
    for (int64_t i = 0; i < ps.count(); ++i) {
      p2p.wait(cur[i]);
      std::byte* dst = data + (ps.chunk.offset + ps.offset(i)) * es;
      reduce_into(dst, half[s % 2] + ps.offset(i) * es, ps.length(i), dtype, op);
      if (s + 1 < steps) p2p.isend(dst, ps.length(i) * es, ring.right);
    }
    std::swap(cur, next);
  }
  p2p.wait_all();
}

// Step s: rank r forwards chunk r-s (its own at s = 0) to the right and
// receives chunk r-s-1 from the left straight into place. Every receive goes
// to its final place, so all of them are posted up front, and each piece is
// forwarded the moment it lands.
void ring_all_gather(P2p& p2p, void* buf, int64_t n, size_t elem_bytes, const RingConfig& cfg) {
  if (p2p.size() == 1 || n == 0) return;
  const Ring ring(p2p, n, elem_bytes, cfg);
  const int steps = ring.size - 1;
  auto* data = static_cast<std::byte*>(buf);
  auto at = [&](const Pieces& ps, int64_t i) { return data + (ps.chunk.offset + ps.offset(i)) * elem_bytes; };

  std::vector<std::vector<int>> recvs(steps);
  for (int s = 0; s < steps; ++s) {
    const Pieces ps = ring.pieces(ring.rank - s - 1);
    for (int64_t i = 0; i < ps.count(); ++i)
      recvs[s].push_back(p2p.irecv(at(ps, i), ps.length(i) * elem_bytes, ring.left));
  }
  const Pieces own = ring.pieces(ring.rank);
  for (int64_t i = 0; i < own.count(); ++i) p2p.isend(at(own, i), own.length(i) * elem_bytes, ring.right);
  for (int s = 0; s + 1 < steps; ++s) {
    const Pieces ps = ring.pieces(ring.rank - s - 1);
    for (int64_t i = 0; i < ps.count(); ++i) {
      p2p.wait(recvs[s][i]);
      p2p.isend(at(ps, i), ps.length(i) * elem_bytes, ring.right);
    }
  }
  p2p.wait_all();
}

void ring_all_reduce(P2p& p2p, void* buf, int64_t n, DType dtype, ReduceOp op, std::vector<std::byte>& scratch,
                     const RingConfig& cfg) {
  ring_reduce_scatter(p2p, buf, n, dtype, op, scratch, cfg);
  if (op == ReduceOp::avg) {
    const Range own = shard_range(n, p2p.size(), p2p.rank());
    divide_by(static_cast<std::byte*>(buf) + own.offset * dtype_size(dtype), own.count, dtype, p2p.size());
  }
  ring_all_gather(p2p, buf, n, dtype_size(dtype), cfg);
}

}  // namespace loom::comm
