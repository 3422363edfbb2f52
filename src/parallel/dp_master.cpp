// DataParallel's checkpoint state (parallel/dp.h): the f32 master weights
// packed like a group's segments (pack_master), set from a checkpoint
// (load_master), gathered whole (gather_master), and the all_gather of
// every rank's pieces of the parameters (gather_pieces).
#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

void DataParallel::pack_master(int g, Tensor out) const {
  const GroupState& gs = impl_->groups[static_cast<size_t>(g)];
  LOOM_CHECK(out.dtype() == DType::f32 && out.numel() == gs.layout.shard_numel, "pack_master: ", out.str());
  if (out.device() != impl_->pools.device()) {  // the host's buffer of a device run (a checkpoint's)
    OwnedTensor staged = impl_->pools[MemTag::workspace].empty(DType::f32, {out.numel()});
    pack_master(g, staged);
    return copy_tensor(out, staged);
  }
  pack_master(g, out, 0);
}

void DataParallel::pack_master(int g, Tensor out, int64_t shard_offset) const {
  const GroupState& gs = impl_->groups[static_cast<size_t>(g)];
  LOOM_CHECK(out.dtype() == DType::f32 && shard_offset >= 0 && shard_offset + out.numel() <= gs.layout.shard_numel &&
                 out.device() == impl_->pools.device(),
             "pack_master: ", out.str(), " at ", shard_offset);
  const int64_t end = shard_offset + out.numel();
  for (size_t b = 0; b < gs.layout.segments.size(); ++b) {
    const Segment& s = gs.layout.segments[b];
    const int64_t lo = std::max(shard_offset, s.shard_offset), hi = std::min(end, s.shard_offset + s.count);
    if (lo >= hi) continue;
    Tensor dst = out.slice(0, lo - shard_offset, hi - lo);
    if (impl_->has_master && impl_->disk) impl_->disk->read_range(g, 0, lo, dst);
    else if (impl_->has_master) copy_between(dst, Tensor(gs.master).slice(0, lo, hi - lo));  // f32 both
    else if (opt_.zero_stage == 3) read_param_shard(gs, static_cast<int>(b), dst, lo - s.shard_offset);
    else
      for_each_flat_run(gs.layout.space, s.offset + (lo - s.shard_offset), hi - lo,
                        [&](int64_t flat, int64_t at, int64_t n) {
                          kernels::cast(dst.slice(0, at, n), model_.params().slice(0, flat, n));
                        });
  }
}

void DataParallel::pack_master(Tensor out) const {
  only_group();
  pack_master(0, out);
}

void DataParallel::load_master(std::span<const Tensor> masters) {
  LOOM_CHECK(static_cast<int>(masters.size()) == num_groups(), "load_master: ", masters.size(), " tensors for ",
             num_groups(), " groups");
  for (int g = 0; g < num_groups(); ++g) {
    GroupState& gs = impl_->groups[static_cast<size_t>(g)];
    const GroupLayout& l = gs.layout;
    const Tensor& given = masters[static_cast<size_t>(g)];
    LOOM_CHECK(given.dtype() == DType::f32 && given.numel() == l.shard_numel, "load_master: ", given.str());
    // A checkpoint's host tensor goes to the run's device first.
    OwnedTensor staged;
    if (given.device() != impl_->pools.device()) {
      staged = impl_->pools[MemTag::workspace].empty(DType::f32, {l.shard_numel});
      copy_tensor(staged, given.reshape({l.shard_numel}));
    }
    const Tensor master = staged.defined() ? Tensor(staged) : given;
    for (size_t b = 0; b < l.segments.size(); ++b) {
      const Segment& s = l.segments[b];
      const Tensor src = master.slice(0, s.shard_offset, s.count);
      if (impl_->has_master) set_master(gs, s, src);
      if (opt_.zero_stage == 3) write_param_shard(gs, static_cast<int>(b), src);
      else
        for_each_flat_run(l.space, s.offset, s.count, [&](int64_t flat, int64_t at, int64_t n) {
          kernels::cast(model_.params().slice(0, flat, n), src.slice(0, at, n));
        });
    }
  }
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) gather_pieces(model_.params());
}

void DataParallel::load_master(const Tensor& master) {
  only_group();
  load_master(std::span<const Tensor>(&master, 1));
}

void DataParallel::gather_master(Tensor out) {
  LOOM_CHECK(out.dtype() == DType::f32 && out.numel() == model_.num_params(), "gather_master: ", out.str());
  if (out.device() != impl_->pools.device()) {  // the host's buffer of a device run (an exported model's)
    OwnedTensor staged = impl_->pools[MemTag::workspace].empty(DType::f32, {out.numel()});
    gather_master(staged);
    return copy_tensor(out, staged);
  }
  for (int g = 0; g < num_groups(); ++g) {
    const GroupLayout& l = impl_->groups[static_cast<size_t>(g)].layout;
    OwnedTensor packed = impl_->pools[MemTag::workspace].empty(DType::f32, {l.shard_numel});
    pack_master(g, packed);
    for (const Segment& s : l.segments)
      unpack_runs(l.space, Tensor(packed).slice(0, s.shard_offset, s.count), s.offset, out);
  }
  if (opt_.zero_stage > 0) gather_pieces(out);
}

void DataParallel::read_master(int64_t flat, Tensor out) const {
  const GroupLayout& l = only_group();
  LOOM_CHECK(l.comm.get().size() == 1 && l.space.numel == model_.num_params(), "read_master: a group of ",
             l.comm.get().size(), " ranks over ", l.space.numel, " of ", model_.num_params(), " parameters");
  const int64_t end = flat + out.numel();
  for (const Segment& s : l.segments) {  // the group's index is the flat element
    const int64_t lo = std::max(flat, s.offset), hi = std::min(end, s.offset + s.count);
    if (lo < hi) pack_master(0, out.slice(0, lo - flat, hi - lo), s.shard_offset + (lo - s.offset));
  }
}

void DataParallel::gather_pieces(Tensor flat) {
  // A bucket spread over the flat buffer gathers into a packed buffer,
  // unpacked once every gather is done.
  struct Spread {
    const GroupSpace* space;
    int64_t begin;
    OwnedTensor buf, mine;
  };
  std::vector<Spread> spread;
  std::vector<comm::WorkPtr> works;
  for (const GroupState& gs : impl_->groups) {
    const GroupLayout& l = gs.layout;
    comm::Communicator& comm = l.comm;
    if (comm.size() == 1) continue;
    for (size_t b = 0; b < l.buckets.size(); ++b) {
      const Bucket& bk = l.buckets[b];
      const Segment& s = l.segments[b];
      if (is_one_run(l.space, bk.begin, bk.numel())) {
        const int64_t at = flat_index(l.space, bk.begin);
        works.push_back(comm.all_gather(comm::copy_view(flat.slice(0, at, bk.numel())),
                                        comm::copy_view(flat.slice(0, at + (s.offset - bk.begin), s.count))));
        continue;
      }
      Spread sp{&l.space, bk.begin, impl_->pools[MemTag::comm].empty(flat.dtype(), {bk.numel()}),
                impl_->pools[MemTag::comm].empty(flat.dtype(), {s.count})};
      pack_runs(l.space, flat, s.offset, sp.mine);
      works.push_back(comm.all_gather(comm::copy_view(sp.buf), comm::copy_view(sp.mine)));
      spread.push_back(std::move(sp));
    }
  }
  for (auto& w : works) w->wait();
  for (const Spread& sp : spread) unpack_runs(*sp.space, sp.buf, sp.begin, flat);
}

}  // namespace loom::parallel
