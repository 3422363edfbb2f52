// DataParallel's stage-3 shard state where it lives (parallel/dp.h): in
// memory, or on disk under parallel.offload = params (DpOptions::disk.params,
// OffloadedShards in parallel/offload.h), extent by extent of the
// optimizer's state: the gradients accumulated into their records, the
// parameter records written and read, and the update streaming both beside
// the optimizer's state.
#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

namespace {

int group_index(const std::vector<GroupState>& groups, const GroupState& gs) {
  return static_cast<int>(&gs - groups.data());
}

}  // namespace

void DataParallel::accumulate_grads(GroupState& gs, int b, const Tensor& piece) {
  const Segment& s = gs.layout.segments[static_cast<size_t>(b)];
  Impl& im = *impl_;
  if (!im.shards) {
    Tensor dst = Tensor(gs.grad_shard).slice(0, s.shard_offset, s.count);
    return kernels::add(dst, dst, piece);
  }
  // Each extent's record, or zeros the first time this step, plus its part
  // of the piece: the in-memory shard's additions, bit for bit. The slots
  // rotate: an extent's write goes on while the next ones are added, and a
  // record written before (micro-batches after the first) is read one
  // extent ahead.
  OffloadedShards& sh = *im.shards;
  const std::vector<OffloadedState::Extent>& extents = im.disk->extents();
  const auto [first, end] = im.disk->extents_of(group_index(im.groups, gs), s.shard_offset, s.count);
  const int base = im.grad_slot;
  const auto slot_of = [&](int64_t i) { return static_cast<int>((base + (i - first)) % OffloadedShards::kSlots); };
  const auto read_ahead = [&](int64_t i) {
    if (i < end && im.written[static_cast<size_t>(i)]) sh.read(OffloadedShards::kGrads, slot_of(i), i);
  };
  read_ahead(first);
  for (int64_t i = first; i < end; ++i) {
    read_ahead(i + 1);
    const ParamPiece& e = extents[static_cast<size_t>(i)].piece;
    const Tensor acc = sh.slot(OffloadedShards::kGrads, slot_of(i), e.count);
    if (!im.written[static_cast<size_t>(i)]) kernels::fill(acc, 0.f);
    kernels::add(acc, acc, piece.slice(0, e.shard_offset - s.shard_offset, e.count));
    // The norm's blocks of this extent; the last micro-batch's are summed.
    std::vector<double>& terms = im.terms[static_cast<size_t>(i)];
    terms.clear();
    if (counts_in_norm(e.offset)) terms = norm_block_sums({&acc, 1});
    sh.write(OffloadedShards::kGrads, slot_of(i), i);
    im.written[static_cast<size_t>(i)] = 1;
  }
  im.grad_slot = static_cast<int>((base + (end - first)) % OffloadedShards::kSlots);
}

void DataParallel::write_param_shard(GroupState& gs, int b, const Tensor& src) {
  const Segment& s = gs.layout.segments[static_cast<size_t>(b)];
  Impl& im = *impl_;
  if (!im.shards) return kernels::cast(Tensor(gs.param_shard).slice(0, s.shard_offset, s.count), src);
  const auto [first, end] = im.disk->extents_of(group_index(im.groups, gs), s.shard_offset, s.count);
  for (int64_t i = first; i < end; ++i) {
    const ParamPiece& e = im.disk->extents()[static_cast<size_t>(i)].piece;
    const int k = im.param_slot;
    im.param_slot = (k + 1) % OffloadedShards::kSlots;
    kernels::cast(im.shards->slot(OffloadedShards::kParams, k, e.count),
                  src.slice(0, e.shard_offset - s.shard_offset, e.count));
    im.shards->write(OffloadedShards::kParams, k, i);
  }
}

void DataParallel::read_param_shard(const GroupState& gs, int b, Tensor dst, int64_t from) const {
  const Segment& s = gs.layout.segments[static_cast<size_t>(b)];
  Impl& im = *impl_;
  const int64_t lo = s.shard_offset + from, hi = lo + dst.numel();
  if (!im.shards) return kernels::cast(dst, Tensor(gs.param_shard).slice(0, lo, hi - lo));
  const auto [first, end] = im.disk->extents_of(group_index(im.groups, gs), lo, hi - lo);
  for (int64_t i = first; i < end; ++i) {
    const ParamPiece& e = im.disk->extents()[static_cast<size_t>(i)].piece;
    const int64_t a = std::max(lo, e.shard_offset), z = std::min(hi, e.shard_offset + e.count);
    im.shards->read(OffloadedShards::kParams, 0, i);
    kernels::cast(dst.slice(0, a - lo, z - a),
                  im.shards->slot(OffloadedShards::kParams, 0, e.count).slice(0, a - e.shard_offset, z - a));
  }
}

void DataParallel::read_params_into(int unit, const Tensor& piece) {
  Impl& im = *impl_;
  const GroupState& gs = im.groups[static_cast<size_t>(im.unit_group[unit])];
  const Segment& s = gs.layout.segments[static_cast<size_t>(im.unit_bucket[unit])];
  const auto [first, end] = im.disk->extents_of(im.unit_group[unit], s.shard_offset, s.count);
  std::vector<io::OffloadFile::Io>& reads = im.gathered[static_cast<size_t>(unit)].reads;
  for (int64_t i = first; i < end; ++i) {
    const ParamPiece& e = im.disk->extents()[static_cast<size_t>(i)].piece;
    reads.push_back(
        im.shards->read_into(OffloadedShards::kParams, i, piece.slice(0, e.shard_offset - s.shard_offset, e.count)));
  }
}

void DataParallel::load_state_streamed(const StateReader& read) {
  Impl& im = *impl_;
  LOOM_CHECK(im.disk, "load_state_streamed without state on disk");
  OffloadedState& state = *im.disk;
  const size_t skip = im.has_master ? 1 : 0;  // the file's array 0: the master weights
  const int arrays = opt_.optimizer_state_floats;
  std::vector<Tensor> parts(static_cast<size_t>(1 + arrays));
  state.stream([&](const OffloadedState::Extent& e, std::span<const Tensor> a) {
    const int64_t n = e.piece.count, i = &e - state.extents().data();
    // Where the weights go: the parameter record's slot (on disk), the
    // parameter shard (stage 3) or the model's flat parameters (a piece is
    // one run of them: its offset is the flat element). Without master
    // weights apart they are the master, read straight there.
    const int k = im.param_slot;
    Tensor weights;
    if (im.shards) {
      im.param_slot = (k + 1) % OffloadedShards::kSlots;
      weights = im.shards->slot(OffloadedShards::kParams, k, n);
    } else if (opt_.zero_stage == 3) {
      weights = Tensor(im.groups[static_cast<size_t>(e.group)].param_shard).slice(0, e.piece.shard_offset, n);
    } else {
      weights = model_.params().slice(0, e.piece.offset, n);
    }
    parts[0] = skip ? a[0] : weights;
    for (int j = 0; j < arrays; ++j) parts[static_cast<size_t>(1 + j)] = a[skip + static_cast<size_t>(j)];
    read(e.group, e.piece.shard_offset, parts);
    if (skip) kernels::cast(weights, a[0]);
    if (im.shards) im.shards->write(OffloadedShards::kParams, k, i);
  });
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) gather_pieces(model_.params());
}

void DataParallel::stream_update_shards(const StreamedUpdate& f) {
  Impl& im = *impl_;
  OffloadedShards& sh = *im.shards;
  OffloadedState& state = *im.disk;
  const size_t skip = im.has_master ? 1 : 0;  // array 0: the master weights
  // Each extent's parameter and gradient records in the slots of its state
  // record's index; the parameters written back.
  const OffloadedState::Hooks hooks{
      [&](int64_t i, int k) {
        sh.read(OffloadedShards::kParams, k, i);
        sh.read(OffloadedShards::kGrads, k, i);
      },
      [&](int64_t i, int k) { sh.write(OffloadedShards::kParams, k, i); }};
  try {
    state.stream(
        [&](const OffloadedState::Extent& e, std::span<const Tensor> a) {
          const int k = static_cast<int>((&e - state.extents().data()) % OffloadedShards::kSlots);
          UpdatePiece u;
          u.grad = sh.slot(OffloadedShards::kGrads, k, e.piece.count);
          const Tensor weights = sh.slot(OffloadedShards::kParams, k, e.piece.count);
          u.master = skip ? a[0] : weights;
          if (skip) u.param = weights;
          f(e.group, e.piece, u, a.subspan(skip));
        },
        hooks);
  } catch (...) {
    try {
      sh.drain();
    } catch (...) {  // the first error goes on
    }
    throw;
  }
}

}  // namespace loom::parallel
