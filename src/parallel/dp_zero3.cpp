// ZeRO stage 3 (parallel/dp.h): each unit's parameters all_gathered over its
// group's communicator just before use, the next unit's gather prefetched,
// the buffer freed after the last use.
#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

void set_acquire_order(const model::Model& model, std::vector<int> (&order)[2]) {
  // The units each pass acquires, in order (Model::hook_events): forward
  // [embeddings], layers, [head] (a tied head reads unit 0 again); backward
  // [head (+ unit 0 when tied)], the layers in reverse (the embedding's
  // backward reads no parameters). A pipeline stage has only some of these.
  for (const model::Pass pass : {model::Pass::forward, model::Pass::backward})
    for (const model::HookEvent& e : model::Model::hook_events(model.config(), pass, model.options().stage))
      if (e.call == model::HookEvent::Call::acquire_params) order[static_cast<int>(pass)].push_back(e.unit);
}

Tensor DataParallel::acquire_params(int unit, model::Pass pass) {
  Impl& im = *impl_;
  LOOM_CHECK(opt_.zero_stage == 3, "acquire_params under ZeRO stage ", opt_.zero_stage);
  // A unit lies whole in one group (require_whole_units) and is its own
  // bucket there: its gathered bucket is the unit in the model's order, the
  // rank's piece at its segment's place in it.
  const auto piece_of = [&](int u) {
    const GroupState& gs = im.groups[static_cast<size_t>(im.unit_group[u])];
    const size_t b = static_cast<size_t>(im.unit_bucket[u]);
    const Segment& s = gs.layout.segments[b];
    return Tensor(im.gathered[u].buf).slice(0, s.offset - gs.layout.buckets[b].begin, s.count);
  };
  auto issue = [&](int u) {
    Impl::Gathered& g = im.gathered[u];
    if (g.buf.defined()) return;
    if (model_.units()[u].numel() == 0) {  // an adapted model's embeddings or head: no adapters, nothing to gather
      g.buf = im.pools[MemTag::comm].empty(model_.compute_dtype(), {0});
      return;
    }
    const GroupState& gs = im.groups[static_cast<size_t>(im.unit_group[u])];
    const Segment& s = gs.layout.segments[im.unit_bucket[u]];
    comm::Communicator& comm = gs.layout.comm;
    g.buf = im.pools[MemTag::comm].empty(model_.compute_dtype(), {model_.units()[u].numel()});
    if (im.shards) {  // on disk: the rank's piece read into its place in the buffer; gathered when acquired
      g.from_disk = true;
      read_params_into(u, piece_of(u));
      return;
    }
    const Tensor mine = Tensor(gs.param_shard).slice(0, s.shard_offset, s.count);
    if (comm.size() == 1) kernels::copy(g.buf, mine);
    else g.work = comm.all_gather(comm::copy_view(g.buf), comm::copy_view(mine));
  };
  issue(unit);
  Impl::Gathered& g = im.gathered[unit];
  if (g.from_disk) gather_read_piece(unit, piece_of(unit));
  if (g.work) {
    const auto start = DpClock::now();
    g.work->wait();
    stats_.exposed_seconds += seconds_since(start);
    g.work.reset();
  }
  ++g.refs;
  // Prefetch the unit this pass reads next.
  const auto& order = im.order[static_cast<int>(pass)];
  size_t& cursor = im.cursor[static_cast<int>(pass)];
  if (cursor >= order.size() || order[cursor] != unit) {
    const auto it = std::find(order.begin(), order.end(), unit);
    cursor = static_cast<size_t>(it - order.begin());
  }
  ++cursor;
  if (cursor < order.size()) issue(order[cursor]);
  return g.buf;
}

void DataParallel::gather_read_piece(int unit, const Tensor& piece) {
  Impl::Gathered& g = impl_->gathered[static_cast<size_t>(unit)];
  g.from_disk = false;
  const auto start = DpClock::now();
  const std::vector<io::OffloadFile::Io> reads = std::move(g.reads);
  g.reads.clear();
  io::OffloadFile::wait_all(reads);
  stats_.offload_wait_seconds += seconds_since(start);
  comm::Communicator& comm = impl_->groups[static_cast<size_t>(impl_->unit_group[unit])].layout.comm;
  if (comm.size() > 1) g.work = comm.all_gather(comm::copy_view(g.buf), comm::copy_view(piece));
}

void DataParallel::release_params(int unit) {
  Impl::Gathered& g = impl_->gathered[unit];
  LOOM_CHECK(g.refs > 0, "release_params(", unit, ") without acquire");
  if (--g.refs == 0) g.buf = OwnedTensor();
}

}  // namespace loom::parallel
