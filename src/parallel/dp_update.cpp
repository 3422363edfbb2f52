// DataParallel's update (parallel/dp.h): where each piece's gradient,
// weights and master weights are, in memory (update_piece; a host copy of
// the gradients under offload_optimizer) or with the optimizer offloaded to
// disk (DpOptions::disk, parallel/offload.h: the master weights and the
// optimizer's arrays stream through the offload file, stream_update).
#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

void DataParallel::update_begin() {
  if (!opt_.offload_optimizer) return;
  // Offload: the update reads a host copy of the gradient shard.
  for (GroupState& gs : impl_->groups)
    for (const ParamPiece& p : gs.layout.pieces) {
      const Tensor grad = opt_.zero_stage < 2 ? model_.grads().slice(0, p.offset, p.count)
                                              : Tensor(gs.grad_shard).slice(0, p.shard_offset, p.count);
      copy_between(Tensor(gs.host_grads).slice(0, p.shard_offset, p.count), grad);
    }
}

UpdatePiece DataParallel::update_piece(int g, const ParamPiece& p) const {
  LOOM_CHECK(!impl_->disk, "update_piece under an optimizer offloaded to disk: stream_update");
  const GroupState& gs = impl_->groups[static_cast<size_t>(g)];
  return update_of(g, p, impl_->has_master ? Tensor(gs.master).slice(0, p.shard_offset, p.count) : Tensor());
}

void DataParallel::set_master(GroupState& gs, const Segment& s, const Tensor& src) {
  if (!impl_->disk) return copy_between(Tensor(gs.master).slice(0, s.shard_offset, s.count), src);  // f32 both
  const auto g = static_cast<int>(&gs - impl_->groups.data());
  impl_->disk->write_range(g, 0, s.shard_offset, src);
}

// Where the reduced gradient, the weights the model reads and the master
// (given, or the weights themselves) live.
UpdatePiece DataParallel::update_of(int g, const ParamPiece& p, const Tensor& master) const {
  const GroupState& gs = impl_->groups[static_cast<size_t>(g)];
  const int stage = opt_.zero_stage;
  UpdatePiece u;
  u.grad = opt_.offload_optimizer ? Tensor(gs.host_grads).slice(0, p.shard_offset, p.count)
           : stage < 2            ? model_.grads().slice(0, p.offset, p.count)
                                  : Tensor(gs.grad_shard).slice(0, p.shard_offset, p.count);
  const Tensor weights = stage < 3 ? model_.params().slice(0, p.offset, p.count)
                                   : Tensor(gs.param_shard).slice(0, p.shard_offset, p.count);
  u.master = master.defined() ? master : weights;
  if (master.defined()) u.param = weights;
  return u;
}

bool DataParallel::state_on_disk() const { return impl_->disk != nullptr; }

int64_t DataParallel::offload_bytes() const {
  int64_t n = 0;
  if (impl_->disk) n += impl_->disk->file().bytes_read() + impl_->disk->file().bytes_written();
  if (impl_->shards) n += impl_->shards->file().bytes_read() + impl_->shards->file().bytes_written();
  return n;
}

void DataParallel::stream_update(const StreamedUpdate& f) {
  LOOM_CHECK(impl_->disk, "stream_update without an optimizer offloaded to disk");
  if (impl_->shards) return stream_update_shards(f);
  const size_t skip = impl_->has_master ? 1 : 0;  // array 0: the master weights
  impl_->disk->stream([&](const OffloadedState::Extent& e, std::span<const Tensor> arrays) {
    f(e.group, e.piece, update_of(e.group, e.piece, skip ? arrays[0] : Tensor()), arrays.subspan(skip));
  });
}

void DataParallel::read_optimizer_state(int g, int k, Tensor out, int64_t shard_offset) const {
  const bool whole = shard_offset < 0;
  LOOM_CHECK(impl_->disk && (whole ? out.numel() == group(g).shard_numel
                                   : shard_offset + out.numel() <= group(g).shard_numel),
             "read_optimizer_state: ", out.str(), " at ", shard_offset);
  impl_->disk->read_range(g, k + (impl_->has_master ? 1 : 0), whole ? 0 : shard_offset, out.reshape({out.numel()}));
}

void DataParallel::write_optimizer_state(int g, int k, const Tensor& in) {
  LOOM_CHECK(impl_->disk && in.numel() == group(g).shard_numel, "write_optimizer_state: ", in.str());
  impl_->disk->write_range(g, k + (impl_->has_master ? 1 : 0), 0, in.reshape({in.numel()}));
}

}  // namespace loom::parallel
