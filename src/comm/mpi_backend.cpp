#include "comm/mpi_backend.h"

#include <climits>

#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/validate.h"
#include "core/error.h"

namespace loom::comm {
namespace {

std::string op_text(const Tensor& t, ReduceOp op) { return concat(describe(t), ", ", reduce_op_name(op)); }

// MPI counts are int: refuse what would overflow rather than truncate.
void require_int_count(const char* op, const std::string& comm, int64_t n) {
  LOOM_REQUIRE(n <= INT_MAX, op, " on communicator '", comm, "': ", n,
               " elements exceed the MPI backend's limit of 2^31-1 per message");
}

// World rank of each member of comm, for messages and names.
std::vector<int> world_ranks(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Group group, world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> ranks(size), world(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  MPI_Group_translate_ranks(group, size, ranks.data(), world_group, world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  return world;
}

}  // namespace

std::unique_ptr<Communicator> mpi_world(const Options& options) {
  mpi_ensure_initialized();
  LOOM_REQUIRE(options.timeout_s > 0, "comm timeout_s = ", options.timeout_s, " is invalid: it must be > 0 seconds");
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return std::make_unique<MpiCommunicator>(comm, "world", options);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, const Options& options)
    : comm_(comm), info_(std::make_shared<CommInfo>()) {
  // Errors come back as return codes (turned into loom::Error naming the op)
  // instead of MPI's default abort with MPI's own text.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_dup(comm_, &ring_);
  MPI_Comm_dup(comm_, &ctl_);
  MPI_Comm_dup(comm_, &split_);
  for (MPI_Comm c : {ring_, ctl_, split_}) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  info_->name = std::move(name);
  info_->options = options;
  info_->ctl = ctl_;
  MPI_Comm_rank(comm_, &info_->rank);
  MPI_Comm_size(comm_, &info_->size);
  info_->world_ranks = world_ranks(comm_);
  engine_ = std::make_unique<Engine>(comm_, info_);
}

MpiCommunicator::~MpiCommunicator() {
  // Finishes queued ops while engine_ is still set: their bodies call it
  // (unique_ptr::reset nulls the pointer before deleting). Nothing uses the
  // MPI communicators after this.
  engine_->stop();
  engine_.reset();
  for (MPI_Comm* c : {&comm_, &ring_, &ctl_, &split_}) MPI_Comm_free(c);
}

WorkPtr MpiCommunicator::issue(CollDesc desc, std::string what, std::function<void()> body) {
  desc.seq = ++coll_seq_;
  auto work = std::make_shared<OpWork>(info_, std::move(what), desc.seq, -1);
  const bool check = info_->options.check_collectives;
  engine_->submit_collective(work, [this, desc, check, body = std::move(body)] {
    if (check) check_same_call(desc);
    body();
  });
  return work;
}

WorkPtr MpiCommunicator::all_reduce(Tensor buf, ReduceOp op) {
  const CallSite at{"all_reduce", name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_reduce_op(at, buf.dtype(), op);
  require_int_count(at.op, name(), buf.numel());
  CollDesc d{0, buf.numel(), int32_t(CollKind::all_reduce), int32_t(buf.dtype()), int32_t(op), -1};
  return issue(d, concat("all_reduce(", op_text(buf, op), ")"), [this, buf, op] { run_all_reduce(buf, op); });
}

WorkPtr MpiCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op) {
  const CallSite at{"reduce_scatter", name(), size(), device()};
  validate_reduce_scatter(at, rank(), out, in, op);
  require_int_count(at.op, name(), in.numel());
  CollDesc d{0, in.numel(), int32_t(CollKind::reduce_scatter), int32_t(in.dtype()), int32_t(op), -1};
  return issue(d, concat("reduce_scatter(", op_text(in, op), ")"),
               [this, out, in, op] { run_reduce_scatter(out, in, op); });
}

WorkPtr MpiCommunicator::all_gather(Tensor out, Tensor in) {
  const CallSite at{"all_gather", name(), size(), device()};
  validate_all_gather(at, rank(), out, in);
  require_int_count(at.op, name(), out.numel());
  CollDesc d{0, out.numel(), int32_t(CollKind::all_gather), int32_t(out.dtype()), -1, -1};
  return issue(d, concat("all_gather(", describe(out), ")"), [this, out, in] { run_all_gather(out, in); });
}

WorkPtr MpiCommunicator::broadcast(Tensor buf, int root) {
  const CallSite at{"broadcast", name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_peer(at, "root", root);
  require_int_count(at.op, name(), buf.numel());
  CollDesc d{0, buf.numel(), int32_t(CollKind::broadcast), int32_t(buf.dtype()), -1, root};
  return issue(d, concat("broadcast(", describe(buf), ", root ", root, ")"), [this, buf, root] {
    MPI_Request req;
    MPI_Ibcast(buf.data(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()), root, comm_, &req);
    complete(req);
  });
}

WorkPtr MpiCommunicator::all_to_all(Tensor out, Tensor in) {
  const CallSite at{"all_to_all", name(), size(), device()};
  validate_all_to_all(at, out, in);
  require_int_count(at.op, name(), in.numel());
  CollDesc d{0, in.numel(), int32_t(CollKind::all_to_all), int32_t(in.dtype()), -1, -1};
  return issue(d, concat("all_to_all(", describe(in), ")"), [this, out, in] {
    const int block = static_cast<int>(in.numel() / size());
    MPI_Request req;
    MPI_Datatype t = mpi_type(in.dtype());
    MPI_Ialltoall(in.data(), block, t, out.data(), block, t, comm_, &req);
    complete(req);
  });
}

WorkPtr MpiCommunicator::all_to_all_v(Tensor out, std::span<const int64_t> out_counts, Tensor in,
                                      std::span<const int64_t> in_counts) {
  const CallSite at{"all_to_all_v", name(), size(), device()};
  validate_all_to_all_v(at, out, out_counts, in, in_counts);
  require_int_count(at.op, name(), std::max(in.numel(), out.numel()));
  CollDesc d{0, -1, int32_t(CollKind::all_to_all_v), int32_t(in.dtype()), -1, -1};
  std::vector<int64_t> oc(out_counts.begin(), out_counts.end()), ic(in_counts.begin(), in_counts.end());
  return issue(d, concat("all_to_all_v(", describe(in), " in, ", out.numel(), " out)"),
               [this, out, in, oc = std::move(oc), ic = std::move(ic)] { run_all_to_all_v(out, oc, in, ic); });
}

WorkPtr MpiCommunicator::barrier() {
  CollDesc d{0, 0, int32_t(CollKind::barrier), -1, -1, -1};
  return issue(d, "barrier", [this] {
    MPI_Request req;
    MPI_Ibarrier(comm_, &req);
    complete(req);
  });
}

WorkPtr MpiCommunicator::issue_p2p(bool is_send, Tensor buf, int peer, int tag, bool guarded) {
  const char* op = is_send ? "send" : "recv";
  const CallSite at{op, name(), size(), device()};
  validate_buffer(at, "buf", buf);
  validate_peer(at, "peer", peer);
  require_int_count(op, name(), buf.numel());
  // 32767 is the smallest MPI_TAG_UB the MPI standard allows.
  LOOM_REQUIRE(tag >= 0 && tag <= 32767, op, " on communicator '", name(), "': tag ", tag,
               " is out of range: allowed 0..32767");
  auto work = std::make_shared<OpWork>(info_,
                                       concat(op, "(", describe(buf), is_send ? ", to " : ", from ", peer, ", tag ",
                                              tag, ")"),
                                       ++p2p_seq_, peer, guarded);
  engine_->submit_p2p(work, P2pPost{is_send, buf.data(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()),
                                    peer, tag});
  return work;
}

WorkPtr MpiCommunicator::send(Tensor buf, int peer, int tag) { return issue_p2p(true, buf, peer, tag); }
WorkPtr MpiCommunicator::recv(Tensor buf, int peer, int tag) { return issue_p2p(false, buf, peer, tag); }
WorkPtr MpiCommunicator::send_unguarded(Tensor buf, int peer, int tag) { return issue_p2p(true, buf, peer, tag, false); }
WorkPtr MpiCommunicator::recv_unguarded(Tensor buf, int peer, int tag) { return issue_p2p(false, buf, peer, tag, false); }

// A barrier through the engine first: a missing member trips the watchdog
// there rather than hanging in MPI_Comm_split, which has no deadline.
std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  LOOM_REQUIRE(color >= 0, "split of communicator '", this->name(), "': color ", color, " is negative");
  barrier()->wait();
  MPI_Comm sub;
  MPI_Comm_split(split_, color, key, &sub);
  const std::vector<int> world = world_ranks(sub);
  std::string full = name + "[ranks ";
  for (size_t r = 0; r < world.size(); ++r) full += concat(r ? "," : "", world[r]);
  return std::make_unique<MpiCommunicator>(sub, full + "]", info_->options);
}

}  // namespace loom::comm
