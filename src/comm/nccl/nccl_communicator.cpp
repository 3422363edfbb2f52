#include "comm/nccl/nccl_communicator.h"

#include <algorithm>
#include <exception>
#include <tuple>
#include <vector>

#include "comm/nccl/convert.h"
#include "comm/validate.h"
#include "comm/watchdog.h"
#include "core/error.h"

// ncclAvg, ncclBfloat16 and ncclCommGetAsyncError's semantics used here.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0), "loom's NCCL backend needs NCCL 2.10 or newer");

namespace loom::comm {
namespace {

enum CollKind : int64_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll, kAllToAllV, kBarrier };
constexpr const char* kKindNames[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                      "all_to_all", "all_to_all_v",   "barrier"};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: LOOM_CHECK(false, "nccl_type: dtype ", dtype_name(dtype), " is not a comm dtype");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  LOOM_CHECK(false, "nccl_op: unknown ReduceOp ", static_cast<int>(op));
}

// Element `offset` of a contiguous tensor.
void* at_element(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

std::string describe_desc(const std::array<int64_t, 5>& d) {
  const int64_t kind = d[1];
  const char* name = kind >= 0 && kind <= kBarrier ? kKindNames[kind] : "?";
  return concat(name, " #", d[0], " (count ", d[2], ", dtype ", d[3], ", op/root ", d[4], ")");
}

// Makes ncclGroupEnd run even when a call inside the group throws.
class NcclGroup {
 public:
  explicit NcclGroup(const std::string& what) : what_(what) { nccl_require(ncclGroupStart(), nullptr, what); }
  ~NcclGroup() noexcept(false) {
    const ncclResult_t res = ncclGroupEnd();
    if (std::uncaught_exceptions() == 0) nccl_require(res, nullptr, what_);
  }

 private:
  const std::string& what_;
};

// bf16 sums and averages accumulate in f32 (the contract): NCCL reduces f32
// copies, and the result is rounded to bf16 once. max is exact in bf16.
bool reduces_in_f32(DType dtype, ReduceOp op) { return dtype == DType::bf16 && op != ReduceOp::max; }

// n floats from the device's memory pool, allocated and freed in `stream`'s
// order: the free is queued after everything enqueued while this lives.
class StreamF32Scratch {
 public:
  StreamF32Scratch(int64_t n, cudaStream_t stream, const std::string& what) : stream_(stream), what_(what) {
    void* p = nullptr;
    cuda_require(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float), stream),
                 concat(what, ": cudaMallocAsync of ", n, " f32 temporaries"));
    data_ = static_cast<float*>(p);
  }
  ~StreamF32Scratch() noexcept(false) {
    const cudaError_t err = cudaFreeAsync(data_, stream_);
    if (std::uncaught_exceptions() == 0) cuda_require(err, concat(what_, ": cudaFreeAsync of f32 temporaries"));
  }
  StreamF32Scratch(const StreamF32Scratch&) = delete;
  StreamF32Scratch& operator=(const StreamF32Scratch&) = delete;

  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  cudaStream_t stream_;
  const std::string& what_;
};

// in (n bf16) -> out (n f32), and back, queued on the op's stream.
void enqueue_widen(const Tensor& in, float* out, cudaStream_t stream, const std::string& what) {
  cuda_require(widen_bf16_to_f32(in.data(), out, in.numel(), stream), concat(what, ": bf16 -> f32 kernel launch"));
}
void enqueue_narrow(const float* in, const Tensor& out, cudaStream_t stream, const std::string& what) {
  cuda_require(narrow_f32_to_bf16(in, out.data(), out.numel(), stream),
               concat(what, ": f32 -> bf16 kernel launch"));
}

// n divisible by size: NCCL's reduce-scatter; otherwise one ncclReduce per
// shard (shard_range), rooted at the shard's owner, in one group.
void enqueue_reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, int size, const NcclLink& l,
                            const std::string& w) {
  const int64_t n = in.numel();
  const ncclDataType_t type = nccl_type(in.dtype());
  if (n % size == 0) {
    nccl_require(ncclReduceScatter(in.data(), out.data(), n / size, type, nccl_op(op), l.comm, l.stream), l.comm, w);
    return;
  }
  NcclGroup group(w);
  for (int r = 0; r < size; ++r) {
    const Range shard = shard_range(n, size, r);
    nccl_require(ncclReduce(at_element(in, shard.offset), out.data(), shard.count, type, nccl_op(op), r, l.comm,
                            l.stream),
                 l.comm, w);
  }
}

}  // namespace

template <typename F>
WorkPtr NcclCommunicator::issue(NcclLink& link, std::string what, int64_t seq, F&& enqueue) {
  cuda_require(cudaSetDevice(state_->device), concat("cudaSetDevice(", state_->device, ")"));
  order_after_compute(*state_, link, what);
  enqueue(link, what);
  return make_nccl_work(state_, link, std::move(what), seq);
}

// Every rank's description of this collective through the bootstrap
// communicator; any difference is a user error on every rank.
void NcclCommunicator::check_same_collective(CollDesc mine, const std::string& what) {
  if (!state_->options.check_collectives) return;
  std::vector<int64_t> all(mine.size() * size());
  bootstrap_->all_gather(Tensor(all.data(), DType::i64, {static_cast<int64_t>(all.size())}),
                         Tensor(mine.data(), DType::i64, {static_cast<int64_t>(mine.size())}))
      ->wait();
  for (int r = 0; r < size(); ++r) {
    CollDesc theirs;
    std::copy_n(all.begin() + r * mine.size(), mine.size(), theirs.begin());
    if (mine[2] < 0 || theirs[2] < 0) theirs[2] = mine[2] = -1;  // all_to_all_v counts may differ
    LOOM_REQUIRE(theirs == mine, "check_collectives: communicator '", name(), "': rank ", rank(), " issued ",
                 what, " = ", describe_desc(mine), " but rank ", r, " issued ", describe_desc(theirs));
  }
}

// Every rank's counts through the bootstrap: a rank that sends j elements
// to one that expects k != j would otherwise leave NCCL waiting or write past
// a block.
void NcclCommunicator::check_counts(const std::string& what, std::span<const int64_t> out_counts,
                                    std::span<const int64_t> in_counts) {
  std::vector<int64_t> mine = count_words(in_counts, out_counts);
  std::vector<int64_t> all(mine.size() * size());
  bootstrap_->all_gather(Tensor(all.data(), DType::i64, {static_cast<int64_t>(all.size())}),
                         Tensor(mine.data(), DType::i64, {static_cast<int64_t>(mine.size())}))
      ->wait();
  all_to_all_v_counts_agree(concat(what, " on communicator '", name(), "'"), size(), all);
}

WorkPtr NcclCommunicator::all_reduce(Tensor buf, ReduceOp op) {
  const CallSite at{"all_reduce", name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_reduce_op(at, buf.dtype(), op);
  const int64_t seq = ++coll_seq_;
  std::string what = concat("all_reduce(", describe(buf), ", ", reduce_op_name(op), ")");
  check_same_collective({seq, kAllReduce, buf.numel(), static_cast<int64_t>(buf.dtype()), static_cast<int64_t>(op)},
                        what);
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    const int64_t n = buf.numel();
    if (!reduces_in_f32(buf.dtype(), op)) {
      nccl_require(ncclAllReduce(buf.data(), buf.data(), n, nccl_type(buf.dtype()), nccl_op(op), l.comm, l.stream),
                   l.comm, w);
      return;
    }
    StreamF32Scratch wide(n, l.stream, w);
    enqueue_widen(buf, wide.data(), l.stream, w);
    nccl_require(ncclAllReduce(wide.data(), wide.data(), n, ncclFloat32, nccl_op(op), l.comm, l.stream), l.comm, w);
    enqueue_narrow(wide.data(), buf, l.stream, w);
  });
}

// bf16 sum / avg: one scratch holds the f32 input (n) and, from the next
// 256-byte boundary, the f32 shard (out's count) that is narrowed into out.
WorkPtr NcclCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
  const CallSite at{"reduce_scatter", name(), size(), device()};
  validate_reduce_scatter(at, rank(), out, in, op);
  const int64_t seq = ++coll_seq_;
  std::string what = concat("reduce_scatter(", describe(in), ", ", reduce_op_name(op), ")");
  check_same_collective({seq, kReduceScatter, in.numel(), static_cast<int64_t>(in.dtype()), static_cast<int64_t>(op)},
                        what);
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    if (!reduces_in_f32(in.dtype(), op)) {
      enqueue_reduce_scatter(out, in, op, size(), l, w);
      return;
    }
    constexpr int64_t kAlign = 256 / sizeof(float);
    const int64_t n = in.numel(), out_offset = (n + kAlign - 1) / kAlign * kAlign;
    StreamF32Scratch scratch(out_offset + out.numel(), l.stream, w);
    const Tensor wide_in(scratch.data(), DType::f32, {n}, device());
    const Tensor wide_out(scratch.data() + out_offset, DType::f32, {out.numel()}, device());
    enqueue_widen(in, scratch.data(), l.stream, w);
    enqueue_reduce_scatter(wide_out, wide_in, op, size(), l, w);
    enqueue_narrow(scratch.data() + out_offset, out, l.stream, w);
  });
}

// n divisible by size: NCCL's all-gather; otherwise one ncclBroadcast per
// shard from its owner into its place in out, in one group.
WorkPtr NcclCommunicator::all_gather(Tensor out, Tensor in) {
  const CallSite at{"all_gather", name(), size(), device()};
  validate_all_gather(at, rank(), out, in);
  const int64_t seq = ++coll_seq_;
  std::string what = concat("all_gather(", describe(out), ")");
  check_same_collective({seq, kAllGather, out.numel(), static_cast<int64_t>(out.dtype()), -1}, what);
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    const int64_t n = out.numel();
    const ncclDataType_t type = nccl_type(out.dtype());
    if (n % size() == 0) {
      nccl_require(ncclAllGather(in.data(), out.data(), n / size(), type, l.comm, l.stream), l.comm, w);
      return;
    }
    NcclGroup group(w);
    for (int r = 0; r < size(); ++r) {
      const Range shard = shard_range(n, size(), r);
      nccl_require(ncclBroadcast(in.data(), at_element(out, shard.offset), shard.count, type, r, l.comm, l.stream),
                   l.comm, w);
    }
  });
}

WorkPtr NcclCommunicator::broadcast(Tensor buf, int root) {
  const CallSite at{"broadcast", name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_peer(at, "root", root);
  const int64_t seq = ++coll_seq_;
  std::string what = concat("broadcast(", describe(buf), ", root ", root, ")");
  check_same_collective({seq, kBroadcast, buf.numel(), static_cast<int64_t>(buf.dtype()), root}, what);
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    nccl_require(ncclBroadcast(buf.data(), buf.data(), buf.numel(), nccl_type(buf.dtype()), root, l.comm, l.stream),
                 l.comm, w);
  });
}

// The stream a message takes: p2p_link (p2p_links.h). On the neighbour
// links, NCCL communicators of two ranks, rank r of the pair (r, r + 1 mod
// size) is rank 0 and r + 1 mod size rank 1 (in the wrap-around pair
// (size - 1, 0), rank size - 1 is 0).
WorkPtr NcclCommunicator::issue_p2p(bool is_send, Tensor buf, int peer, int tag) {
  const char* op = is_send ? "send" : "recv";
  const CallSite at{op, name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_peer(at, "peer", peer);
  LOOM_REQUIRE(peer != rank(), op, " on communicator '", name(), "': peer ", peer,
               " is this rank: the NCCL backend cannot send to itself");
  LOOM_REQUIRE(tag >= 0 && tag <= 32767, op, " on communicator '", name(), "': tag ", tag,
               " is out of range: allowed 0..32767");
  if (!state_->p2p_connected) connect_p2p();
  const P2pLink which = p2p_link(rank(), size(), peer, is_send);
  const int link_peer = which == P2pLink::to_next || which == P2pLink::from_next   ? 1
                        : which == P2pLink::to_prev || which == P2pLink::from_prev ? 0
                                                                                   : peer;
  NcclLink& link = state_->p2p[static_cast<int>(which)];
  std::string what = concat(op, "(", describe(buf), is_send ? ", to " : ", from ", peer, ", tag ", tag, ")");
  return issue(link, std::move(what), ++p2p_seq_, [&](NcclLink& l, const std::string& w) {
    const ncclDataType_t type = nccl_type(buf.dtype());
    nccl_require(is_send ? ncclSend(buf.data(), buf.numel(), type, link_peer, l.comm, l.stream)
                         : ncclRecv(buf.data(), buf.numel(), type, link_peer, l.comm, l.stream),
                 l.comm, w);
  });
}

// NCCL connects two ranks at their first message, blocking both hosts until
// the other arrives; done here for every neighbour link at once, the way
// nccl_backend.h promises. At size > 2 each rank first makes the two
// neighbour links of the pair (rank, next) (unique ids made here and sent
// to next through the bootstrap) and joins those of (prev, rank).
void NcclCommunicator::connect_p2p() {
  NcclState& s = *state_;
  const std::string what = concat("connecting the point-to-point links of communicator '", s.name, "'");
  const Watchdog dog(s.options.timeout_s, abort_when_late(s, what));  // a neighbour that never sends blocks NCCL
  cuda_require(cudaSetDevice(s.device), concat("cudaSetDevice(", s.device, ")"));
  const auto link = [&](P2pLink l) -> NcclLink& { return s.p2p[static_cast<int>(l)]; };
  struct Exchange {
    P2pLink link;
    bool is_send;
    int peer;
  };
  std::vector<Exchange> exchanges;
  if (s.size == 2) {
    const int peer = 1 - s.rank;
    exchanges = {{s.rank == 0 ? P2pLink::up : P2pLink::down, true, peer},
                 {s.rank == 0 ? P2pLink::down : P2pLink::up, false, peer}};
  } else if (s.size > 2) {
    const int next = (s.rank + 1) % s.size, prev = (s.rank + s.size - 1) % s.size;
    std::array<ncclUniqueId, 2> mine{}, theirs{};  // the pair's forward and backward links
    for (ncclUniqueId& id : mine) nccl_require(ncclGetUniqueId(&id), nullptr, what);
    constexpr int64_t kWords = sizeof(mine) / sizeof(int64_t);
    static_assert(sizeof(mine) % sizeof(int64_t) == 0);
    WorkPtr sent = bootstrap_->send(Tensor(mine.data(), DType::i64, {kWords}), next, 0);
    bootstrap_->recv(Tensor(theirs.data(), DType::i64, {kWords}), prev, 0)->wait();
    sent->wait();
    const std::array<std::tuple<P2pLink, const ncclUniqueId*, int>, 4> joins = {{
        {P2pLink::to_next, &mine[0], 0},
        {P2pLink::from_next, &mine[1], 0},
        {P2pLink::from_prev, &theirs[0], 1},
        {P2pLink::to_prev, &theirs[1], 1},
    }};
    for (const auto& [l, id, pair_rank] : joins) cuda_require(create_link_stream(&link(l).stream), "cudaStreamCreate");
    {
      NcclGroup group(what);
      for (const auto& [l, id, pair_rank] : joins)
        nccl_require(ncclCommInitRank(&link(l).comm, 2, *id, pair_rank), nullptr, what);
    }
    exchanges = {{P2pLink::to_next, true, 1},
                 {P2pLink::to_prev, true, 0},
                 {P2pLink::from_next, false, 1},
                 {P2pLink::from_prev, false, 0}};
  }
  {
    NcclGroup group(what);
    float* slot = s.scratch + 1;
    for (const Exchange& e : exchanges) {
      NcclLink& l = link(e.link);
      nccl_require(e.is_send ? ncclSend(s.scratch, 1, ncclFloat32, e.peer, l.comm, l.stream)
                             : ncclRecv(slot++, 1, ncclFloat32, e.peer, l.comm, l.stream),
                   l.comm, what);
    }
  }
  for (const Exchange& e : exchanges) cuda_require(cudaStreamSynchronize(link(e.link).stream), what);
  s.p2p_connected = true;
}

WorkPtr NcclCommunicator::send(Tensor buf, int peer, int tag) { return issue_p2p(true, buf, peer, tag); }
WorkPtr NcclCommunicator::recv(Tensor buf, int peer, int tag) { return issue_p2p(false, buf, peer, tag); }

WorkPtr NcclCommunicator::all_to_all(Tensor out, Tensor in) {
  const CallSite at{"all_to_all", name(), size(), device()};
  validate_all_to_all(at, out, in);
  const int64_t block = in.numel() / size();
  const std::vector<int64_t> counts(size(), block);
  return all_to_all_v(out, counts, in, counts);
}

// Grouped ncclSend/ncclRecv with every rank (itself included: NCCL pairs a
// self send and recv inside one group).
WorkPtr NcclCommunicator::all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                                       std::span<const int64_t> in_counts) {
  const CallSite at{"all_to_all_v", name(), size(), device()};
  validate_all_to_all_v(at, out, out_counts, in, in_counts);
  const int64_t seq = ++coll_seq_;
  std::string what = concat("all_to_all_v(", describe(in), " -> ", out.numel(), " elements)");
  check_same_collective({seq, kAllToAllV, -1, static_cast<int64_t>(in.dtype()), -1}, what);
  if (state_->options.check_collectives) check_counts(concat(what, " #", seq), out_counts, in_counts);
  std::vector<int64_t> out_offsets(size()), in_offsets(size());
  for (int r = 1; r < size(); ++r) {
    out_offsets[r] = out_offsets[r - 1] + out_counts[r - 1];
    in_offsets[r] = in_offsets[r - 1] + in_counts[r - 1];
  }
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    const ncclDataType_t type = nccl_type(in.dtype());
    NcclGroup group(w);
    for (int r = 0; r < size(); ++r) {
      nccl_require(ncclSend(at_element(in, in_offsets[r]), in_counts[r], type, r, l.comm, l.stream), l.comm, w);
      nccl_require(ncclRecv(at_element(out, out_offsets[r]), out_counts[r], type, r, l.comm, l.stream), l.comm, w);
    }
  });
}

WorkPtr NcclCommunicator::barrier() {
  const int64_t seq = ++coll_seq_;
  std::string what = "barrier";
  check_same_collective({seq, kBarrier, 1, static_cast<int64_t>(DType::f32), -1}, what);
  return issue(state_->coll, std::move(what), seq, [&](NcclLink& l, const std::string& w) {
    float* word = state_->scratch;
    nccl_require(ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, l.comm, l.stream), l.comm, w);
  });
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  LOOM_REQUIRE(color >= 0, "split of communicator '", this->name(), "': color ", color, " is negative");
  return std::make_unique<NcclCommunicator>(bootstrap_->split(color, key, name), state_->device, state_->options,
                                            state_->compute);
}

}  // namespace loom::comm
