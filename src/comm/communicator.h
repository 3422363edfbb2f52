// Communicator: the collectives and point-to-point operations every
// parallelism is built on (DESIGN.md §2 comm). Backends: MPI (OpenMPI; the
// default, also a single process started without mpirun), NCCL on GPUs.
//
// Every operation is asynchronous: it returns a Work handle at once and runs
// while the caller computes; `->wait()` makes it blocking. Rules:
//   - Buffers are contiguous Tensors of f32, bf16, i32 or i64 on the
//     communicator's device; they must stay alive and untouched until the
//     Work completes. bf16 sums and averages accumulate in f32.
//   - Collectives on one communicator run one at a time in issue order, and
//     every member must issue the same collectives in the same order.
//   - send/recv are posted in issue order but do not wait for each other, so
//     a rank may post a send and a recv to the same peer (the pipeline's
//     exchange) without deadlock.
//   - Every blocking wait has a deadline (Options::timeout_s). Past it the
//     whole job aborts with one message naming the operation, its sequence
//     number, the communicator and the ranks that did not arrive. test()
//     keeps the same deadline, counted from the issue.
//   - Destroying a communicator with pending Work finishes that work first
//     (every member must still issue the matching operations); whatever is
//     still pending timeout_s after destruction began aborts the job with the
//     watchdog's message naming the unfinished operations.
//   - MPI errors (e.g. a recv smaller than the message sent to it) finish the
//     Work with a loom::Error naming the op, its sequence number, the
//     communicator and the peer; wait() rethrows it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace loom::comm {

// A user error that every member of a communicator raises together, at the
// same point and with the same message, because a collective told them all
// (e.g. their run configs differ). Unlike an error on one rank it needs no
// job abort: every rank leaves normally with a non-zero status, and rank 0
// alone reports it, so the job prints it once.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

enum class ReduceOp : uint8_t { sum, avg, max };
// Reductions and gathers: MPI's own collectives, or loom's ring algorithms on
// point-to-point messages (parallel.comm_algo).
enum class Algo : uint8_t { mpi, ring };

std::string_view reduce_op_name(ReduceOp op);
std::string_view algo_name(Algo algo);
// Parses "mpi" / "ring"; loom::Error listing the allowed names otherwise.
Algo algo_from_name(std::string_view name);

struct Options {
  double timeout_s = 300;           // parallel.timeout_s; any length past ~31 years waits that long (deadline.h)
  Algo algo = Algo::mpi;            // parallel.comm_algo
  bool check_collectives = false;   // --check-collectives: verify every rank issues the same op
};

// Elements [offset, offset + count) of an n-element buffer held by `rank` when
// it is split across `size` ranks: contiguous in rank order, the first
// n % size ranks hold one element more. Used by reduce_scatter / all_gather
// and by every sharded flat buffer (ZeRO).
struct Range {
  int64_t offset = 0;
  int64_t count = 0;
};
Range shard_range(int64_t n, int size, int rank);

// The tensor as the operations that only copy (send, recv, all_gather,
// broadcast, all_to_all, all_to_all_v) move it: itself, or f16 viewed as
// the bf16 of the same size and shape (the communicator has no f16; no
// reduction may see such a view).
inline Tensor copy_view(const Tensor& t) {
  return t.dtype() == DType::f16 ? Tensor(t.data(), DType::bf16, t.shape(), t.device()) : t;
}

// A pending operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is complete; rethrows its loom::Error.
  virtual void wait() = 0;
  // True once complete; never blocks.
  virtual bool test() = 0;
  // Withdraws an operation of send_unguarded / recv_unguarded (no-op for any
  // other, or once complete): a receive is cancelled, a send abandoned. The
  // Work is then complete and its buffer's contents undefined; the buffer
  // must stay alive until the process exits, as MPI may still read a send's
  // or write a receive's (one matched before its peer died never completes,
  // so nothing waits for it).
  virtual void cancel() {}
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For messages: "world", "tp", "dp", ... with the world ranks it holds.
  virtual const std::string& name() const = 0;
  virtual Device device() const = 0;
  virtual const Options& options() const = 0;

  // buf (n) <- op over ranks of buf; in place.
  virtual WorkPtr all_reduce(Tensor buf, ReduceOp op) = 0;
  // out (shard_range(n, size, rank).count) <- op over ranks of in (n), this rank's range.
  // Aliasing: out may be exactly this rank's range of in (in place, ZeRO);
  // in is then left unchanged outside out. Any other overlap is a loom::Error.
  virtual WorkPtr reduce_scatter(Tensor out, Tensor in, ReduceOp op) = 0;
  // out (n) <- every rank's in (shard_range(n, size, r).count), in rank order.
  // Aliasing: in may be exactly this rank's range of out (in place, ZeRO);
  // any other overlap is a loom::Error.
  virtual WorkPtr all_gather(Tensor out, Tensor in) = 0;
  // buf <- root's buf.
  virtual WorkPtr broadcast(Tensor buf, int root) = 0;
  virtual WorkPtr send(Tensor buf, int peer, int tag = 0) = 0;
  virtual WorkPtr recv(Tensor buf, int peer, int tag = 0) = 0;
  // in and out hold size() equal blocks; block j of in goes to rank j, block
  // i of out comes from rank i.
  virtual WorkPtr all_to_all(Tensor out, Tensor in) = 0;
  // Blocks of the given element counts (size() each), packed in rank order.
  virtual WorkPtr all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                               std::span<const int64_t> in_counts) = 0;
  virtual WorkPtr barrier() = 0;

  // A send / receive with a peer that may die without ending the job
  // (parameter-server workers, parallel/ps.h): no deadline (test() and
  // wait() never trip the watchdog) and Work::cancel() withdraws it. The
  // caller detects a lost peer itself and must cancel what it still has
  // posted to it before destroying the communicator. Backends without
  // fault-tolerant point-to-point throw loom::Error.
  virtual WorkPtr send_unguarded(Tensor buf, int peer, int tag);
  virtual WorkPtr recv_unguarded(Tensor buf, int peer, int tag);

  // The ranks that pass the same color form a new communicator, ordered by
  // key (MPI_Comm_split). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;
};

// A process-wide note that a peer of this job was lost (a parameter-server
// worker dropped from the run): the job's end then skips the final barrier
// over the world, which the lost rank would never reach.
void note_lost_peer();
bool lost_a_peer();

}  // namespace loom::comm
