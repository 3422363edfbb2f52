// The NCCL backend: Communicators over NVIDIA's NCCL for tensors in GPU
// memory, connected through a bootstrap Communicator (MPI) that launches and
// names the processes. Built only where the CUDA toolkit, NCCL and nvcc are
// found (the library loom_comm_nccl defines LOOM_HAVE_NCCL=1 for its users).
//
// How it maps the Communicator contract (comm/communicator.h):
//   - Each communicator owns NCCL communicators, each with its own CUDA
//     stream: one over all its ranks for collectives, and point-to-point
//     streams chosen by p2p_link (comm/p2p_links.h). On a stream an op
//     starts once the op before it has finished, and a send may finish only
//     once its receive has started, so the streams are split finely enough
//     that this queueing adds no order the messages lack: messages between
//     neighbours in rank order (r, r + 1 mod size: the pipeline's stages,
//     the context-parallel ring) have a stream of their own per pair and
//     direction (at size > 2, NCCL communicators of two ranks; at size 2 the
//     two below). Other messages share one stream per direction (lower to
//     higher rank, higher to lower) over all ranks. So a send and a recv
//     with the same peer never wait for each other. NCCL has no tags:
//     messages in one direction between two ranks match in issue order
//     whatever their tag, and a rank cannot send to itself (loom::Error).
//   - NCCL connects two ranks for point-to-point at their first message,
//     blocking both hosts until the other arrives. So a communicator's first
//     send or recv makes its neighbour links and connects every neighbour
//     stream at once: it returns when both neighbours have issued their own
//     first send or recv on this communicator (the pipeline's and the ring's
//     first messages are such a point on every rank). A message to a
//     non-neighbour connects that pair when it is first issued, as NCCL does.
//   - An op is enqueued on its stream at once; its Work holds a CUDA event
//     recorded after it. test() queries the event; wait() polls it with a
//     backoff (sleeping, not spinning) until Options::timeout_s, then aborts
//     the NCCL communicator and the whole job with a message naming the op,
//     its sequence number and the communicator. An asynchronous NCCL error
//     aborts the job the same way.
//   - Ordering with compute: an op's stream first waits (a CUDA event)
//     for everything already queued on the compute stream (nccl_world's:
//     the CUDA backend's, where its ops run), so it reads and writes its buffers
//     after the compute issued before it. The streams are non-blocking, so
//     compute queued later never waits for communication: a receive posted
//     early (the pipeline's) holds no kernel back, and gradients reduce
//     while the backward goes on. Work on other streams must be
//     synchronised by the caller before the call. After wait() returns, the
//     result is visible to every stream.
//   - bf16 sums and averages accumulate in f32, as the contract says: on the
//     op's stream the bf16 input is widened into f32 temporaries
//     (cudaMallocAsync, freed with cudaFreeAsync on the same stream after
//     the op), NCCL reduces them as ncclFloat32 with the same op, and a
//     second kernel (convert.cu) rounds the result to bf16 once (to nearest
//     even) into the output. The cost: f32 temporaries of twice the bf16
//     buffer's bytes (reduce_scatter: the input plus the output shard), two
//     conversion kernels, and twice the bytes on the wire. bf16 max stays
//     in bf16 (exact).
//   - reduce_scatter / all_gather with n divisible by size() use NCCL's own
//     collective; otherwise (shard_range gives the first n % size ranks one
//     more element) they run as size() grouped ncclReduce / ncclBroadcast
//     calls, one per shard, with no padding copies.
//   - all_to_all(_v): grouped ncclSend/ncclRecv. barrier: a one-element
//     all-reduce.
//   - split: the bootstrap communicator is split the same way (its name, with
//     the world ranks, names the new communicator) and a fresh NCCL unique id
//     is broadcast through it; ranks therefore match the bootstrap's exactly.
//   - check_collectives: every collective first exchanges its description
//     through the bootstrap communicator (blocking) and a mismatch is a
//     loom::Error. Options::algo is ignored: NCCL picks its own algorithms.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/memory.h"

namespace loom::comm {

// Number of CUDA devices this process can use. 0 when there is none, with
// *reason (if given) saying why: the CUDA runtime's error ("no CUDA-capable
// device is detected", "CUDA driver version is insufficient ...") or
// "the CUDA runtime reports 0 devices".
int cuda_device_count(std::string* reason = nullptr);

// The NCCL communicator of every rank of `bootstrap`, on GPU `device` of this
// process (Device::cuda(device)); named "world". Collective over bootstrap;
// the result keeps its own split of it, so bootstrap may be destroyed first.
// Every op waits for the work enqueued before it on `compute` (the
// Context's stream: the CUDA backend's, kernels/cuda/cuda_backend.h), or on
// the legacy default stream where compute has no handle; its splits wait for
// the same stream. loom::Error if `device` is not a usable CUDA device,
// compute is another device's, or options are invalid.
std::unique_ptr<Communicator> nccl_world(Communicator& bootstrap, int device, const Options& options = {},
                                         Stream compute = {});

// LOOM_NCCL_SHARE_GPU=1 (any value but empty or 0): the job's ranks may share
// a GPU, to prove the NCCL paths on a machine with fewer GPUs than ranks (a
// test's mode: slow). NCCL refuses two ranks of one communicator on one
// device of one host ("Duplicate GPU detected"), so nccl_world then tells
// NCCL that each rank is a host of its own (NCCL_HOSTID=loom-rank-<rank>),
// and the ranks connect through NCCL's socket transport on the loopback
// interface (NCCL_NET=Socket, NCCL_SOCKET_IFNAME==lo, NCCL_IB_DISABLE=1,
// NVLink SHARP and multi-node NVLink off); variables the user set are kept.
bool nccl_shares_gpus();

}  // namespace loom::comm
