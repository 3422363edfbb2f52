#include "parallel/pp_runtime.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/pp_messages.h"

namespace loom::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// The MPI standard guarantees tags up to 32767 (MPI_TAG_UB may be larger).
constexpr int kMaxTag = 32767;

// Adds the seconds of its lifetime to `total`.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(Clock::now()) {}
  ~Timed() { total_ += std::chrono::duration<double>(Clock::now() - start_).count(); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double& total_;
  Clock::time_point start_;
};

// (micro-batch, local chunk)
using MbChunk = std::pair<int, int>;
// (is_grad, micro-batch, receiving local chunk)
using MsgKey = std::tuple<bool, int, int>;

}  // namespace

struct PipelineRuntime::Impl {
  // Message buffers from pools[comm], kept across steps: a step reuses the
  // previous step's buffers instead of allocating.
  struct Cache {
    Pool* pool;
    std::vector<OwnedTensor> free;
    OwnedTensor take(DType dtype, const Shape& shape) {
      for (auto it = free.begin(); it != free.end(); ++it)
        if (it->dtype() == dtype && it->shape() == shape) {
          OwnedTensor t = std::move(*it);
          free.erase(it);
          return t;
        }
      return pool->empty(dtype, shape);
    }
    void give(OwnedTensor t) { free.push_back(std::move(t)); }
  };
  struct Received {  // a recv's own buffer and (unless local) its Work
    OwnedTensor buf;
    comm::WorkPtr work;
  };
  struct Sent {  // a gradient's copy in flight, taken back at point `release` (pp_messages.h)
    OwnedTensor buf;
    comm::WorkPtr work;
    int release = 0;
  };

  comm::Communicator* pp;
  std::vector<model::Stage*> chunks;
  std::vector<PpAction> actions;  // this rank's list
  PpMessagePoints points;         // where its receives are posted and its gradient sends taken back
  std::vector<std::vector<size_t>> posts_at;  // per point: the receives posted there
  std::function<void(int, int)> before_backward;
  TraceRecorder* trace = nullptr;
  int rank = 0, n_pp = 1, v = 1, m = 1, stages = 1;
  Cache cache;

  // One run's state; empty between runs.
  std::vector<std::vector<int>> free_slots;  // per chunk
  std::map<MbChunk, int> slot_of;
  std::map<MbChunk, comm::WorkPtr> act_send;
  std::map<MbChunk, Received> act_recv, grad_recv;
  std::vector<Sent> grad_send;
  std::map<MsgKey, OwnedTensor> local;  // pp = 1: messages a rank sends itself
  double wait_s = 0, compute_s = 0, loss_sum = 0;

  int stage_of(int chunk) const { return chunk * n_pp + rank; }
  bool first(int chunk) const { return stage_of(chunk) == 0; }
  bool last(int chunk) const { return stage_of(chunk) == stages - 1; }
  // Unique among the messages between two ranks: the receiver's stage fixes
  // its chunk, and (kind, micro-batch, receiving chunk) names one message.
  int tag(bool is_grad, int micro_batch, int recv_chunk) const {
    return (micro_batch * v + recv_chunk) * 2 + (is_grad ? 1 : 0);
  }

  // "forward m3 c1": built only while tracing, so tracing off formats nothing.
  std::string span_name(const char* what, int micro_batch, int chunk) const {
    return trace != nullptr ? concat(what, " m", micro_batch, " c", chunk) : std::string();
  }

  int take_slot(int micro_batch, int chunk) {
    std::vector<int>& free_list = free_slots[static_cast<size_t>(chunk)];
    LOOM_REQUIRE(!free_list.empty(), "PipelineRuntime: chunk ", chunk, " (stage ", stage_of(chunk),
                 ") has no free activation slot for micro-batch ", micro_batch, ": its model has ",
                 chunks[static_cast<size_t>(chunk)]->slots(), "; build it with at least slots_needed() slots");
    const int slot = free_list.back();
    free_list.pop_back();
    const bool fresh = slot_of.emplace(MbChunk{micro_batch, chunk}, slot).second;
    LOOM_CHECK(fresh, "micro-batch ", micro_batch, " already holds a slot of chunk ", chunk);
    return slot;
  }
  int slot(int micro_batch, int chunk) const {
    auto it = slot_of.find({micro_batch, chunk});
    LOOM_CHECK(it != slot_of.end(), "micro-batch ", micro_batch, " holds no slot of chunk ", chunk);
    return it->second;
  }
  // The actions (run() dispatches on PpOp).
  void receive(const PpAction& a);  // recv_act and recv_grad
  // dloss: the backward's that follows (Stage::forward), none in forward_only.
  void forward(const PpAction& a, std::span<const Tensor> tokens, std::span<const Tensor> targets,
               std::span<const std::vector<int64_t>> samples, std::optional<float> dloss);
  void send_act(const PpAction& a);
  void backward(const PpAction& a, float dloss);
  void send_grad(const PpAction& a, int release);
  void finish();

  // The gradient sends due at `point` are waited for (their receives are
  // posted by then: pp_messages.h) and their buffers go back to the cache.
  void release_grad_sends(int point) {
    const bool due = std::any_of(grad_send.begin(), grad_send.end(), [&](const Sent& s) { return s.release <= point; });
    if (!due) return;
    TraceSpan span(trace, "recv wait");
    Timed t(wait_s);
    std::erase_if(grad_send, [&](Sent& s) {
      if (s.release > point) return false;
      s.work->wait();  // rethrows the send's error, if any
      cache.give(std::move(s.buf));
      return true;
    });
  }
};

PipelineRuntime::PipelineRuntime(const PpSchedule& schedule, comm::Communicator& pp_group,
                                 std::vector<model::Stage*> chunks, Pools& pools)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  comm::Communicator* pp = &pp_group;
  LOOM_REQUIRE(pp->size() == schedule.pp, "PipelineRuntime: the schedule is for pp = ", schedule.pp,
               " ranks but the pipeline group '", pp->name(), "' has ", pp->size());
  LOOM_REQUIRE(static_cast<int>(schedule.actions.size()) == schedule.pp, "PipelineRuntime: the schedule lists ",
               schedule.actions.size(), " ranks' actions for pp = ", schedule.pp);
  LOOM_REQUIRE(static_cast<int>(chunks.size()) == schedule.virtual_stages, "PipelineRuntime: ", chunks.size(),
               " chunk models given for a schedule of ", schedule.virtual_stages, " chunks per rank");
  s.pp = pp, s.chunks = std::move(chunks), s.cache.pool = &pools[MemTag::comm];
  s.rank = pp->rank(), s.n_pp = schedule.pp, s.v = schedule.virtual_stages, s.m = schedule.micro_batches;
  s.stages = s.n_pp * s.v;
  s.actions = schedule.actions[static_cast<size_t>(s.rank)];
  s.points = pp_message_points(schedule, s.rank);
  s.posts_at.assign(s.actions.size(), {});
  for (size_t j = 0; j < s.actions.size(); ++j)
    if (s.points.post[j] >= 0) s.posts_at[static_cast<size_t>(s.points.post[j])].push_back(j);
  for (int c = 0; c < s.v; ++c) {
    const model::Stage* chunk = s.chunks[static_cast<size_t>(c)];
    LOOM_REQUIRE(chunk != nullptr, "PipelineRuntime: chunk ", c, " has no stage");
    LOOM_REQUIRE(chunk->has_embedding() == s.first(c) && chunk->has_head() == s.last(c), "PipelineRuntime: chunk ",
                 c, " of pipeline rank ", s.rank, " is stage ", s.stage_of(c), " of ", s.stages,
                 ", but its model (layers ", chunk->first_layer(), " to ",
                 chunk->first_layer() + chunk->num_layers() - 1, ") ",
                 chunk->has_embedding() ? "holds" : "lacks", " the embeddings and ",
                 chunk->has_head() ? "holds" : "lacks", " the head");
    const int need = slots_needed(schedule, s.rank, c);
    LOOM_REQUIRE(chunk->slots() >= need, "PipelineRuntime: chunk ", c, " (stage ", s.stage_of(c), ") has ",
                 chunk->slots(), " activation slots; the ", pp_schedule_name(schedule.kind), " schedule keeps ",
                 need, " micro-batches in flight on it");
  }
  // pp = 1 sends nothing over the communicator (local copies), so no tags.
  const int64_t top_tag = (static_cast<int64_t>(s.m) * s.v) * 2 - 1;
  LOOM_REQUIRE(s.n_pp == 1 || top_tag <= kMaxTag, "PipelineRuntime: ", s.m, " micro-batches x ", s.v,
               " chunks need message tags up to ", top_tag, ", past ", kMaxTag,
               ", the largest MPI guarantees: allowed micro-batches x chunks <= ", (kMaxTag + 1) / 2);
}

// A run that threw can leave messages in flight, which may still write or
// read their buffers (a device pool's free does not wait for NCCL's
// streams): those not complete are kept until the process exits, as
// comm::Work::cancel asks of an abandoned operation's buffer.
PipelineRuntime::~PipelineRuntime() {
  static auto* const kept = new std::vector<OwnedTensor>;  // never freed, on purpose
  auto keep_if_pending = [&](OwnedTensor& buf, const comm::WorkPtr& work) {
    bool done = true;
    try {
      done = !work || work->test();
    } catch (...) {  // failed: complete, the buffer no longer in use
    }
    if (!done) kept->push_back(std::move(buf));
  };
  Impl& s = *impl_;
  for (auto& [key, r] : s.act_recv) keep_if_pending(r.buf, r.work);
  for (auto& [key, r] : s.grad_recv) keep_if_pending(r.buf, r.work);
  for (Impl::Sent& sent : s.grad_send) keep_if_pending(sent.buf, sent.work);
}

int PipelineRuntime::slots_needed(const PpSchedule& schedule, int rank, int chunk) {
  LOOM_REQUIRE(rank >= 0 && rank < static_cast<int>(schedule.actions.size()), "PipelineRuntime::slots_needed: rank ",
               rank, " is invalid: allowed 0 to ", static_cast<int>(schedule.actions.size()) - 1);
  LOOM_REQUIRE(chunk >= 0 && chunk < schedule.virtual_stages, "PipelineRuntime::slots_needed: chunk ", chunk,
               " is invalid: allowed 0 to ", schedule.virtual_stages - 1);
  int in_flight = 0, most = 0;
  for (const PpAction& a : schedule.actions[static_cast<size_t>(rank)]) {
    if (a.chunk != chunk) continue;
    if (a.op == PpOp::forward) most = std::max(most, ++in_flight);
    if (a.op == PpOp::backward) --in_flight;
  }
  return most;
}

double PipelineRuntime::run(std::span<const Tensor> tokens, std::span<const Tensor> targets, float dloss,
                            std::span<const std::vector<int64_t>> samples) {
  Impl& s = *impl_;
  bool holds_last = false;
  for (int c = 0; c < s.v; ++c) {
    const size_t need = static_cast<size_t>(s.m);
    LOOM_REQUIRE(!s.first(c) || tokens.size() >= need, "PipelineRuntime::run: the first stage needs ", s.m,
                 " micro-batches of tokens, got ", tokens.size());
    LOOM_REQUIRE(!s.last(c) || targets.size() >= need, "PipelineRuntime::run: the last stage needs ", s.m,
                 " micro-batches of targets, got ", targets.size());
    holds_last = holds_last || s.last(c);
  }
  LOOM_REQUIRE(samples.empty() || samples.size() >= static_cast<size_t>(s.m), "PipelineRuntime::run: ",
               samples.size(), " micro-batches of sample indices for ", s.m, " micro-batches");
  s.wait_s = 0, s.compute_s = 0, s.loss_sum = 0;
  s.free_slots.assign(static_cast<size_t>(s.v), {});
  for (int c = 0; c < s.v; ++c)
    for (int k = s.chunks[static_cast<size_t>(c)]->slots(); k-- > 0;) s.free_slots[static_cast<size_t>(c)].push_back(k);
  // At each point: the gradient sends due are taken back, the receives due
  // are posted (a compute's, for the actions before the next compute: their
  // messages arrive while it runs), then the action runs.
  for (size_t i = 0; i < s.actions.size(); ++i) {
    s.release_grad_sends(static_cast<int>(i));
    for (size_t j : s.posts_at[i]) s.receive(s.actions[j]);
    const PpAction& a = s.actions[i];
    switch (a.op) {
      case PpOp::recv_act:
      case PpOp::recv_grad: break;  // posted above
      case PpOp::forward: s.forward(a, tokens, targets, samples, dloss); break;
      case PpOp::send_act: s.send_act(a); break;
      case PpOp::backward: s.backward(a, dloss); break;
      case PpOp::send_grad: s.send_grad(a, s.points.release[i]); break;
    }
  }
  s.finish();
  wait_s_ = s.wait_s, compute_s_ = s.compute_s;
  return holds_last ? s.loss_sum / s.m : 0.0;
}

void PipelineRuntime::set_trace(TraceRecorder* trace) { impl_->trace = trace; }

void PipelineRuntime::set_before_backward(std::function<void(int, int)> hook) {
  impl_->before_backward = std::move(hook);
}

// Stage by stage (a rank's chunks in stage order): each rank's chunk c waits
// for stage c pp + r - 1, which precedes it, so the pass cannot deadlock;
// each slot is freed once its output is sent, since no backward follows.
double PipelineRuntime::forward_only(const Tensor& tokens, const Tensor& targets) {
  Impl& s = *impl_;
  s.loss_sum = 0;
  s.free_slots.assign(static_cast<size_t>(s.v), {});
  for (int c = 0; c < s.v; ++c) s.free_slots[static_cast<size_t>(c)].push_back(0);
  const int prev = (s.rank + s.n_pp - 1) % s.n_pp, next = (s.rank + 1) % s.n_pp;
  bool holds_last = false;
  for (int c = 0; c < s.v; ++c) {
    if (!s.first(c)) s.receive({PpOp::recv_act, 0, c, prev});
    s.forward({PpOp::forward, 0, c, -1}, std::span<const Tensor>(&tokens, 1), std::span<const Tensor>(&targets, 1), {},
              std::nullopt);
    if (!s.last(c)) s.send_act({PpOp::send_act, 0, c, next});
    holds_last = holds_last || s.last(c);
    if (auto it = s.act_send.find({0, c}); it != s.act_send.end()) {
      it->second->wait();
      s.act_send.erase(it);
    }
    s.slot_of.erase({0, c});
  }
  s.finish();
  return holds_last ? s.loss_sum : 0.0;
}

// recv_act / recv_grad: the message into a buffer of its own — an input is
// copied into its activation slot by the forward (which takes the slot), a
// gradient into stage_grad() (shared by every micro-batch's backward) by the
// backward.
void PipelineRuntime::Impl::receive(const PpAction& a) {
  const int mb = a.micro_batch, c = a.chunk;
  const bool is_grad = a.op == PpOp::recv_grad;
  const model::Stage& chunk = *chunks[static_cast<size_t>(c)];
  const Tensor like = is_grad ? chunk.stage_grad() : chunk.stage_input(0);  // every slot's input has this shape
  Received r;
  if (a.peer != rank) {
    TraceSpan span(trace, span_name(is_grad ? "post recv_grad" : "post recv_act", mb, c));
    r.buf = cache.take(is_grad ? DType::f32 : like.dtype(), like.shape());
    r.work = pp->recv(comm::copy_view(r.buf), a.peer, tag(is_grad, mb, c));
  } else {
    auto it = local.find({is_grad, mb, c});
    LOOM_CHECK(it != local.end(), pp_op_name(a.op), " m", mb, " c", c, " before its local send");
    r.buf = std::move(it->second);
    local.erase(it);
  }
  (is_grad ? grad_recv : act_recv)[{mb, c}] = std::move(r);
}

void PipelineRuntime::Impl::forward(const PpAction& a, std::span<const Tensor> tokens,
                                    std::span<const Tensor> targets, std::span<const std::vector<int64_t>> samples,
                                    std::optional<float> dloss) {
  const int mb = a.micro_batch, c = a.chunk;
  const int s = take_slot(mb, c);
  if (!first(c)) {
    auto it = act_recv.find({mb, c});
    LOOM_CHECK(it != act_recv.end(), "forward m", mb, " c", c, " without its recv_act");
    {
      TraceSpan span(it->second.work ? trace : nullptr, "recv wait");
      Timed t(wait_s);
      if (it->second.work) it->second.work->wait();
    }
    kernels::copy(chunks[static_cast<size_t>(c)]->stage_input(s), it->second.buf);
    cache.give(std::move(it->second.buf));
    act_recv.erase(it);
  }
  chunks[static_cast<size_t>(c)]->set_samples(
      samples.empty() ? std::span<const int64_t>() : std::span<const int64_t>(samples[static_cast<size_t>(mb)]), s);
  TraceSpan span(trace, span_name("forward", mb, c));
  Timed t(compute_s);
  const float loss = chunks[static_cast<size_t>(c)]->forward(first(c) ? tokens[static_cast<size_t>(mb)] : Tensor(),
                                                             last(c) ? targets[static_cast<size_t>(mb)] : Tensor(), s,
                                                             dloss);
  if (last(c)) loss_sum += loss;
}

// send_act: the receiver is stage + 1 on rank peer, its chunk (stage + 1) / pp.
// stage_output(slot) stays untouched until the slot's backward, which waits
// for the send first.
void PipelineRuntime::Impl::send_act(const PpAction& a) {
  const int mb = a.micro_batch, c = a.chunk, to_chunk = (stage_of(c) + 1) / n_pp;
  const Tensor out = chunks[static_cast<size_t>(c)]->stage_output(slot(mb, c));
  TraceSpan span(trace, "send_act");
  if (a.peer != rank) {
    act_send[{mb, c}] = pp->send(comm::copy_view(out), a.peer, tag(false, mb, to_chunk));
    return;
  }
  OwnedTensor buf = cache.take(out.dtype(), out.shape());
  kernels::copy(buf, out);
  local.emplace(MsgKey{false, mb, to_chunk}, std::move(buf));
}

void PipelineRuntime::Impl::backward(const PpAction& a, float dloss) {
  const int mb = a.micro_batch, c = a.chunk, s = slot(mb, c);
  model::Stage& chunk = *chunks[static_cast<size_t>(c)];
  {
    const bool waits = !last(c) || act_send.contains({mb, c});
    TraceSpan span(waits ? trace : nullptr, "recv wait");
    Timed t(wait_s);
    if (auto it = act_send.find({mb, c}); it != act_send.end()) {  // backward may rewrite the output
      it->second->wait();
      act_send.erase(it);
    }
    if (!last(c)) {
      auto it = grad_recv.find({mb, c});
      LOOM_CHECK(it != grad_recv.end(), "backward m", mb, " c", c, " without its recv_grad");
      if (it->second.work) it->second.work->wait();
      kernels::copy(chunk.stage_grad(), it->second.buf);
      cache.give(std::move(it->second.buf));
      grad_recv.erase(it);
    }
  }
  if (before_backward) before_backward(c, mb);
  {
    TraceSpan span(trace, span_name("backward", mb, c));
    Timed t(compute_s);
    chunk.backward(dloss, s);
  }
  slot_of.erase({mb, c});
  free_slots[static_cast<size_t>(c)].push_back(s);
}

// send_grad: a copy of stage_grad(), which the next backward overwrites; the
// receiver is stage - 1, its chunk (stage - 1) / pp.
void PipelineRuntime::Impl::send_grad(const PpAction& a, int release) {
  const int mb = a.micro_batch, c = a.chunk, to_chunk = (stage_of(c) - 1) / n_pp;
  const Tensor g = chunks[static_cast<size_t>(c)]->stage_grad();
  TraceSpan span(trace, "send_grad");
  OwnedTensor buf = cache.take(DType::f32, g.shape());
  kernels::copy(buf, g);
  if (a.peer == rank) {
    local.emplace(MsgKey{true, mb, to_chunk}, std::move(buf));
    return;
  }
  comm::WorkPtr w = pp->send(buf, a.peer, tag(true, mb, to_chunk));
  grad_send.push_back({std::move(buf), std::move(w), release});
}

// Every send completes before run() returns (the buffers belong to the
// models and the cache); a well-formed schedule leaves nothing else behind.
void PipelineRuntime::Impl::finish() {
  {
    TraceSpan span(act_send.empty() && grad_send.empty() ? nullptr : trace, "recv wait");
    Timed t(wait_s);
    for (auto& [key, w] : act_send) w->wait();
    for (Sent& sent : grad_send) sent.work->wait(), cache.give(std::move(sent.buf));
  }
  act_send.clear(), grad_send.clear();
  LOOM_CHECK(slot_of.empty() && act_recv.empty() && grad_recv.empty() && local.empty(),
             "PipelineRuntime::run: the schedule left ", slot_of.size(), " micro-batches in flight, ",
             act_recv.size() + grad_recv.size(), " receives unused and ", local.size(), " local messages");
}

}  // namespace loom::parallel
