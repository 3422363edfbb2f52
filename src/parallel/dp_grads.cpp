// DataParallel's gradient reduction (parallel/dp.h): each bucket's
// collective issued as backward finishes it, over its group's communicator.
#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

Tensor DataParallel::acquire_grads(int unit) {
  Impl& im = *impl_;
  LOOM_CHECK(opt_.zero_stage >= 2, "acquire_grads under ZeRO stage ", opt_.zero_stage);
  if (model_.units()[unit].numel() == 0) return Tensor(nullptr, DType::f32, {0});  // in no bucket
  GroupState& gs = im.groups[static_cast<size_t>(im.unit_group[unit])];
  const int b = im.unit_bucket[unit];
  const Bucket& bk = gs.layout.buckets[b];
  if (!gs.open[b].defined()) gs.open[b] = im.pools[MemTag::comm].zeros(DType::f32, {bk.numel()});
  // The unit lies whole in its group (require_whole_units): its elements are
  // one range of the bucket, in the model's order.
  const model::Unit& u = gs.layout.space.units[unit];
  LOOM_CHECK(u.numel() == model_.units()[unit].numel(), "unit ", unit, " is split between groups");
  return Tensor(gs.open[b]).slice(0, u.begin - bk.begin, u.numel());
}

void DataParallel::grads_ready(int unit) {
  Impl& im = *impl_;
  if (opt_.zero_stage < 2) {
    if (!im.communicate) return;
    for (int g = 0; g < num_groups(); ++g) {
      if (im.groups[static_cast<size_t>(g)].layout.comm.get().size() == 1 && !opt_.exchange) continue;
      for (int b : im.groups[static_cast<size_t>(g)].finishes[unit]) reduce_bucket(g, b);  // buckets whose lowest unit this is
    }
    return;
  }
  const int g = im.unit_group[unit], b = im.unit_bucket[unit];
  GroupState& gs = im.groups[static_cast<size_t>(g)];
  const Bucket& bk = gs.layout.buckets[b];
  if (unit != bk.first_unit) return;  // the bucket's lowest unit finishes it
  const Segment& seg = gs.layout.segments[b];
  OwnedTensor buf = std::move(gs.open[b]);
  LOOM_CHECK(buf.defined(), "bucket ", b, " of group ", gs.layout.name, " finished without gradients");
  comm::Communicator& comm = gs.layout.comm;
  if (comm.size() == 1) return accumulate_grads(gs, b, Tensor(buf).slice(0, seg.offset - bk.begin, seg.count));
  // The reduced piece lands in its own buffer (not in place: the MPI backend
  // would copy the whole bucket to a scratch buffer to reduce in place).
  OwnedTensor piece = im.pools[MemTag::comm].empty(DType::f32, {seg.count});
  stats_.ops++, stats_.bytes += bytes_of(buf);
  comm::WorkPtr work = comm.reduce_scatter(piece, buf, comm::ReduceOp::avg);
  im.reducing.push_back({std::move(buf), std::move(piece), std::move(work), g, b});
  // At most kMaxReductionsInFlight stay in flight (the memory of stage 2 is
  // the shard plus a few buckets): the oldest is waited for and added into
  // the shard when one more starts. The rest are retired by grad_norm(), so
  // the last buckets overlap the next micro-batch's forward. Retiring only
  // here, never as a test() happens to find one done, keeps the buffers'
  // lifetimes, and so the comm peak, the same in every run: loom plan
  // predicts it (dp_layout.h zero_comm_peak).
  while (im.reducing.size() > kMaxReductionsInFlight) retire_reduction();
}

void DataParallel::params_needed(int unit) {
  if (!opt_.exchange || model_.units()[unit].numel() == 0) return;
  opt_.exchange->params_needed(impl_->unit_bucket[unit]);
}

void DataParallel::reduce_bucket(int g, int b) {
  Impl& im = *impl_;
  const GroupLayout& l = im.groups[static_cast<size_t>(g)].layout;
  comm::Communicator& comm = l.comm;
  const Bucket& bk = l.buckets[b];
  const Segment& seg = l.segments[b];
  const Tensor grads = model_.grads();
  if (is_one_run(l.space, bk.begin, bk.numel())) {  // in place
    const int64_t at = flat_index(l.space, bk.begin);
    const Tensor in = grads.slice(0, at, bk.numel());
    stats_.ops++, stats_.bytes += bytes_of(in);
    Impl::Pending p;
    if (opt_.exchange) p.work = opt_.exchange->exchange(b, in);
    else if (opt_.zero_stage == 0) p.work = comm.all_reduce(in, comm::ReduceOp::avg);
    else p.work = comm.reduce_scatter(grads.slice(0, at + (seg.offset - bk.begin), seg.count), in, comm::ReduceOp::avg);
    im.pending.push_back(std::move(p));
    return;
  }
  // Spread over the flat buffer: a packed copy is reduced, and unpacked into
  // the gradients by wait_gradients.
  Impl::Pending p;
  p.group = g, p.bucket = b;
  p.packed = im.pools[MemTag::comm].empty(DType::f32, {bk.numel()});
  pack_runs(l.space, grads, bk.begin, p.packed);
  stats_.ops++, stats_.bytes += bytes_of(p.packed);
  if (opt_.zero_stage == 0) {
    p.work = comm.all_reduce(p.packed, comm::ReduceOp::avg);
  } else {
    p.piece = im.pools[MemTag::comm].empty(DType::f32, {seg.count});
    p.work = comm.reduce_scatter(p.piece, p.packed, comm::ReduceOp::avg);
  }
  im.pending.push_back(std::move(p));
}

void DataParallel::retire_reduction() {
  Impl& im = *impl_;
  Impl::GradBuffer& g = im.reducing.front();
  const auto start = DpClock::now();
  g.work->wait();
  stats_.exposed_seconds += seconds_since(start);
  accumulate_grads(im.groups[static_cast<size_t>(g.group)], g.bucket, g.piece);
  im.reducing.pop_front();
}

void DataParallel::wait_gradients() {
  Impl& im = *impl_;
  const auto start = DpClock::now();
  for (auto& p : im.pending) p.work->wait();
  stats_.exposed_seconds += seconds_since(start);
  for (const Impl::Pending& p : im.pending) {
    if (!p.packed.defined()) continue;
    const GroupLayout& l = im.groups[static_cast<size_t>(p.group)].layout;
    if (opt_.zero_stage == 0) unpack_runs(l.space, p.packed, l.buckets[p.bucket].begin, model_.grads());
    else unpack_runs(l.space, p.piece, l.segments[p.bucket].offset, model_.grads());
  }
  im.pending.clear();
  while (!im.reducing.empty()) retire_reduction();
}

}  // namespace loom::parallel
