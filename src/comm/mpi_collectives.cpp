// The bodies of MpiCommunicator's collectives: they run on the engine
// thread, one at a time in issue order (mpi_communicator.h).
#include <algorithm>
#include <cstring>

#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/reduce.h"
#include "comm/ring.h"
#include "comm/validate.h"
#include "core/error.h"

namespace loom::comm {
namespace {

// The ring's messages as MPI point-to-point on the ring communicator; waits
// go through the engine so user send/recv keep moving meanwhile.
class MpiP2p final : public P2p {
 public:
  MpiP2p(Engine& engine, MPI_Comm comm, int rank, int size) : engine_(engine), comm_(comm), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int isend(const void* data, size_t bytes, int peer) override {
    reqs_.emplace_back();
    check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &reqs_.back()), "send", bytes, peer);
    return static_cast<int>(reqs_.size()) - 1;
  }
  int irecv(void* data, size_t bytes, int peer) override {
    reqs_.emplace_back();
    check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, &reqs_.back()), "receive", bytes, peer);
    return static_cast<int>(reqs_.size()) - 1;
  }
  void wait(int h) override { engine_.wait(&reqs_.at(h)); }
  void wait_all() override {
    for (MPI_Request& r : reqs_) engine_.wait(&r);
    reqs_.clear();
  }

 private:
  // The Work of the running collective gets this error (Engine::loop).
  void check(int rc, const char* what, size_t bytes, int peer) {
    if (rc != MPI_SUCCESS)
      throw Error(concat(engine_.running_label(), ": ring algorithm: posting a ", what, " of ", bytes, " bytes with ring peer ", peer,
                         " failed: ", mpi_error_text(rc)));
  }

  Engine& engine_;
  MPI_Comm comm_;
  int rank_, size_;
  std::vector<MPI_Request> reqs_;
};

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

const char* kind_name(int32_t kind) {
  static const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                "all_to_all", "all_to_all_v",   "barrier"};
  return kind >= 0 && kind < 7 ? names[kind] : "unknown";
}

// An f32 view of scratch holding n elements.
float* f32_scratch(std::vector<std::byte>& scratch, int64_t n) {
  scratch.resize(std::max<size_t>(scratch.size(), static_cast<size_t>(n) * sizeof(float)));
  return reinterpret_cast<float*>(scratch.data());
}

}  // namespace

std::string describe(const CollDesc& d) {
  std::string s = concat(kind_name(d.kind), "(");
  if (d.dtype >= 0) s += concat(dtype_name(static_cast<DType>(d.dtype)));
  if (d.count >= 0 && d.kind != int32_t(CollKind::barrier)) s += concat(", ", d.count, " elements");
  if (d.op >= 0) s += concat(", ", reduce_op_name(static_cast<ReduceOp>(d.op)));
  if (d.root >= 0) s += concat(", root ", d.root);
  return s + ")";
}

void MpiCommunicator::complete(MPI_Request req) { engine_->wait(&req); }

// Every rank gathers every rank's descriptor, so all of them find the same
// first mismatch and throw the same message.
void MpiCommunicator::check_same_call(const CollDesc& mine) {
  std::vector<CollDesc> all(size());
  MPI_Request req;
  MPI_Iallgather(&mine, sizeof(CollDesc), MPI_BYTE, all.data(), sizeof(CollDesc), MPI_BYTE, comm_, &req);
  complete(req);
  for (int r = 1; r < size(); ++r) {
    const CollDesc& a = all[0];
    const CollDesc& b = all[r];
    const bool same = a.seq == b.seq && a.kind == b.kind && a.dtype == b.dtype && a.count == b.count &&
                      a.op == b.op && a.root == b.root;
    LOOM_REQUIRE(same, "check_collectives: collective #", mine.seq, " on communicator '", name(),
                 "' differs between ranks: rank 0 calls ", describe(a), " as #", a.seq, ", rank ", r, " calls ",
                 describe(b), " as #", b.seq);
  }
}

void MpiCommunicator::run_all_reduce(Tensor buf, ReduceOp op) {
  const int64_t n = buf.numel();
  void* data = buf.data();
  DType dtype = buf.dtype();
  float* f32 = nullptr;
  if (dtype == DType::bf16) {  // reduce an f32 copy, round back once
    f32 = f32_scratch(scratch_, n);
    bf16_to_f32(f32, buf.data_as<bf16>(), n);
    data = f32;
    dtype = DType::f32;
  }
  if (info_->options.algo == Algo::ring) {
    MpiP2p p2p(*engine_, ring_, rank(), size());
    ring_all_reduce(p2p, data, n, dtype, op, ring_scratch_);
  } else {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), mpi_type(dtype), mpi_op(op), comm_, &req);
    complete(req);
    if (op == ReduceOp::avg) divide_by(data, n, dtype, size());
  }
  if (f32) f32_to_bf16(buf.data_as<bf16>(), f32, n);
}

void MpiCommunicator::run_reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
  const int64_t n = in.numel();
  const Range own = shard_range(n, size(), rank());
  const DType dtype = in.dtype() == DType::bf16 ? DType::f32 : in.dtype();
  const size_t es = dtype_size(dtype);
  // The ring reduces in place, bf16 goes through f32, and in place (out is
  // this rank's range of in; MPI forbids overlapping buffers, and MPI_IN_PLACE
  // on in itself would overwrite other ranks' ranges of it): all need a copy of in.
  void* result = out.data();
  if (in.dtype() == DType::bf16 || info_->options.algo == Algo::ring || is_own_shard(in, out, own)) {
    scratch_.resize(std::max(scratch_.size(), static_cast<size_t>(n) * es));
    if (in.dtype() == DType::bf16) bf16_to_f32(reinterpret_cast<float*>(scratch_.data()), in.data_as<bf16>(), n);
    else if (n > 0) std::memcpy(scratch_.data(), in.data(), static_cast<size_t>(n) * es);  // data() may be null at 0
    result = scratch_.data() + own.offset * es;
  }
  if (info_->options.algo == Algo::ring) {
    MpiP2p p2p(*engine_, ring_, rank(), size());
    ring_reduce_scatter(p2p, scratch_.data(), n, dtype, op, ring_scratch_);
  } else {
    std::vector<int> counts(size());
    for (int r = 0; r < size(); ++r) counts[r] = static_cast<int>(shard_range(n, size(), r).count);
    const void* src = result == out.data() ? in.data() : MPI_IN_PLACE;
    if (src == MPI_IN_PLACE) result = scratch_.data();  // in-place results land at the start
    MPI_Request req;
    MPI_Ireduce_scatter(src, src == MPI_IN_PLACE ? scratch_.data() : out.data(), counts.data(), mpi_type(dtype),
                        mpi_op(op), comm_, &req);
    complete(req);
  }
  if (op == ReduceOp::avg) divide_by(result, own.count, dtype, size());
  if (in.dtype() == DType::bf16) f32_to_bf16(out.data_as<bf16>(), static_cast<const float*>(result), own.count);
  else if (result != out.data() && own.count > 0) std::memcpy(out.data(), result, static_cast<size_t>(own.count) * es);
}

void MpiCommunicator::run_all_gather(Tensor out, Tensor in) {
  const int64_t n = out.numel();
  const size_t es = dtype_size(out.dtype());
  const Range own = shard_range(n, size(), rank());
  if (info_->options.algo == Algo::ring) {
    auto* dst = static_cast<std::byte*>(out.data()) + own.offset * es;
    if (own.count > 0 && dst != in.data()) std::memmove(dst, in.data(), static_cast<size_t>(own.count) * es);
    MpiP2p p2p(*engine_, ring_, rank(), size());
    ring_all_gather(p2p, out.data(), n, es);
    return;
  }
  std::vector<int> counts(size()), displs(size());
  for (int r = 0; r < size(); ++r) {
    const Range rr = shard_range(n, size(), r);
    counts[r] = static_cast<int>(rr.count);
    displs[r] = static_cast<int>(rr.offset);
  }
  MPI_Datatype t = mpi_type(out.dtype());
  // In place (in is this rank's range of out): MPI forbids overlapping buffers.
  const void* src = is_own_shard(out, in, own) ? MPI_IN_PLACE : in.data();
  MPI_Request req;
  MPI_Iallgatherv(src, static_cast<int>(own.count), t, out.data(), counts.data(), displs.data(), t, comm_, &req);
  complete(req);
}

// check_collectives: every rank gathers every rank's send and receive
// counts, so all of them find the same first pair that disagrees.
void MpiCommunicator::check_all_to_all_v_counts(const std::vector<int64_t>& out_counts,
                                                const std::vector<int64_t>& in_counts) {
  const int n = size();
  const std::vector<int64_t> mine = count_words(in_counts, out_counts);
  std::vector<int64_t> all(static_cast<size_t>(2 * n) * n);
  MPI_Request req;
  MPI_Iallgather(mine.data(), 2 * n, MPI_INT64_T, all.data(), 2 * n, MPI_INT64_T, comm_, &req);
  complete(req);
  all_to_all_v_counts_agree(engine_->running_label(), n, all);
}

void MpiCommunicator::run_all_to_all_v(Tensor out, std::vector<int64_t> out_counts, Tensor in,
                                       std::vector<int64_t> in_counts) {
  if (info_->options.check_collectives) check_all_to_all_v_counts(out_counts, in_counts);
  std::vector<int> sc(size()), sd(size()), rc(size()), rd(size());
  int64_t so = 0, ro = 0;
  for (int r = 0; r < size(); ++r) {
    sc[r] = static_cast<int>(in_counts[r]);
    sd[r] = static_cast<int>(so);
    rc[r] = static_cast<int>(out_counts[r]);
    rd[r] = static_cast<int>(ro);
    so += in_counts[r];
    ro += out_counts[r];
  }
  MPI_Datatype t = mpi_type(in.dtype());
  MPI_Request req;
  MPI_Ialltoallv(in.data(), sc.data(), sd.data(), t, out.data(), rc.data(), rd.data(), t, comm_, &req);
  complete(req);
}

}  // namespace loom::comm
