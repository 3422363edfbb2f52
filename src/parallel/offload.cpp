// OffloadedState (offload.h): a group's pieces cut into extents, each a
// record of the offload file, streamed through kSlots buffers.
#include "parallel/offload.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/ops.h"

namespace loom::parallel {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

int64_t OffloadedState::chunk_elements(int64_t budget_bytes, int arrays) {
  const int64_t least = kSlots * int64_t{4} * arrays * kGrain + io::kOffloadAlign;
  LOOM_REQUIRE(budget_bytes >= least, "a budget of ", budget_bytes,
               " bytes is below the least the offloaded state streams through: ", kSlots, " buffers of ", kGrain,
               " elements x ", arrays, " f32 arrays (and 4 KiB to align them) = ", least, " bytes (",
               static_cast<double>(least) / (1 << 20), " MiB)");
  return (budget_bytes - io::kOffloadAlign) / kSlots / (int64_t{4} * arrays) / kGrain * kGrain;
}

namespace {

int64_t slot_bytes(int64_t S, int64_t budget_bytes, int arrays) {
  const int64_t elements = std::min(OffloadedState::chunk_elements(budget_bytes, arrays),
                                    round_up(std::max<int64_t>(S, 1), OffloadedState::kGrain));
  return round_up(int64_t{4} * arrays * elements, io::kOffloadAlign);
}

}  // namespace

int64_t OffloadedState::buffer_bytes(int64_t S, int64_t budget_bytes, int arrays) {
  return kSlots * slot_bytes(S, budget_bytes, arrays) + io::kOffloadAlign;
}

OffloadedState::OffloadedState(const std::vector<std::vector<ParamPiece>>& pieces, int arrays, const DiskOffload& o,
                               Pool& pool)
    : arrays_(arrays) {
  LOOM_CHECK(arrays >= 1, "OffloadedState: ", arrays, " arrays");
  chunk_ = chunk_elements(o.budget_bytes, arrays);
  std::vector<int64_t> records;
  for (int g = 0; g < static_cast<int>(pieces.size()); ++g)
    for (const ParamPiece& p : pieces[static_cast<size_t>(g)])
      for (int64_t at = 0; at < p.count; at += chunk_) {
        ParamPiece e = p;
        e.offset += at, e.shard_offset += at, e.count = std::min(chunk_, p.count - at);
        extents_.push_back({g, e});
        records.push_back(int64_t{4} * arrays * e.count);
      }
  int64_t S = 0;
  for (const Extent& e : extents_) S += e.piece.count;
  slot_bytes_ = slot_bytes(S, o.budget_bytes, arrays);
  buffers_ = pool.empty(DType::u8, {buffer_bytes(S, o.budget_bytes, arrays)});
  const auto at = reinterpret_cast<uintptr_t>(Tensor(buffers_).data_as<uint8_t>());  // O_DIRECT: 4 KiB aligned
  first_slot_ = Tensor(buffers_).data_as<uint8_t>() + (round_up(static_cast<int64_t>(at), io::kOffloadAlign) - at);
  file_ = std::make_unique<io::OffloadFile>(io::OffloadFile::Options{o.path, o.direct, o.threads}, std::move(records));
}

OffloadedState::~OffloadedState() = default;

void OffloadedState::stream(const Visit& f, bool write_back, int64_t first, int64_t end, const Hooks* hooks) {
  std::vector<io::OffloadFile::Io> reading(kSlots), writing(kSlots);
  const auto slot_of = [&](int64_t i) { return static_cast<size_t>((i - first) % kSlots); };
  const auto slot = [&](int64_t i) { return first_slot_ + static_cast<int64_t>(slot_of(i)) * slot_bytes_; };
  const auto issue_read = [&](int64_t i) {
    io::OffloadFile::Io& w = writing[slot_of(i)];
    if (w.valid()) io::OffloadFile::wait(w), w = {};  // the slot's last record is on disk
    reading[slot_of(i)] = file_->read(i, slot(i));
    if (hooks && hooks->read) hooks->read(i, static_cast<int>(slot_of(i)));
  };
  const auto drain = [&] {  // every I/O in flight done, errors or not
    for (auto* ios : {&reading, &writing})
      for (io::OffloadFile::Io& io : *ios)
        if (io.valid()) io.wait(), io = {};
  };
  try {
    for (int64_t i = first; i < std::min<int64_t>(first + kSlots - 2, end); ++i) issue_read(i);
    std::vector<Tensor> views(static_cast<size_t>(arrays_));
    for (int64_t i = first; i < end; ++i) {
      if (i + kSlots - 2 < end) issue_read(i + kSlots - 2);
      io::OffloadFile::Io& r = reading[slot_of(i)];
      io::OffloadFile::wait(r), r = {};
      const Extent& e = extents_[static_cast<size_t>(i)];
      auto* floats = reinterpret_cast<float*>(slot(i));
      for (int a = 0; a < arrays_; ++a)
        views[static_cast<size_t>(a)] = Tensor(floats + a * e.piece.count, DType::f32, {e.piece.count});
      f(e, views);
      if (write_back) writing[slot_of(i)] = file_->write(i, slot(i));
      if (write_back && hooks && hooks->write) hooks->write(i, static_cast<int>(slot_of(i)));
    }
    for (io::OffloadFile::Io& w : writing)
      if (w.valid()) io::OffloadFile::wait(w), w = {};
  } catch (...) {
    drain();
    throw;
  }
}

std::pair<int64_t, int64_t> OffloadedState::extents_of(int g, int64_t shard_offset, int64_t n) const {
  // The group's extents, in shard order: the first that ends past shard_offset, to the first that starts at the end.
  const auto before = [](const Extent& e, std::pair<int, int64_t> at) {
    return e.group < at.first || (e.group == at.first && e.piece.shard_offset + e.piece.count <= at.second);
  };
  const auto lo = std::lower_bound(extents_.begin(), extents_.end(), std::pair{g, shard_offset}, before);
  auto hi = lo;
  while (hi != extents_.end() && hi->group == g && hi->piece.shard_offset < shard_offset + n) ++hi;
  return {lo - extents_.begin(), hi - extents_.begin()};
}

void OffloadedState::for_range(int g, int a, int64_t shard_offset, int64_t n, bool write_back,
                               const std::function<void(const Tensor&, int64_t, int64_t, int64_t)>& f) {
  LOOM_CHECK(a >= 0 && a < arrays_, "OffloadedState: array ", a, " of ", arrays_);
  const auto [first, end] = extents_of(g, shard_offset, n);
  stream([&](const Extent& e, std::span<const Tensor> v) {
    const int64_t from = std::max(shard_offset, e.piece.shard_offset);
    const int64_t to = std::min(shard_offset + n, e.piece.shard_offset + e.piece.count);
    f(v[static_cast<size_t>(a)], from - e.piece.shard_offset, to - e.piece.shard_offset, from - shard_offset);
  }, write_back, first, end);
}

void OffloadedState::read_range(int g, int a, int64_t shard_offset, Tensor out) {
  LOOM_CHECK(out.dtype() == DType::f32 && out.ndim() == 1, "OffloadedState::read_range: ", out.str());
  for_range(g, a, shard_offset, out.numel(), false, [&](const Tensor& array, int64_t lo, int64_t hi, int64_t at) {
    kernels::copy(out.slice(0, at, hi - lo), array.slice(0, lo, hi - lo));
  });
}

void OffloadedState::write_range(int g, int a, int64_t shard_offset, const Tensor& in) {
  LOOM_CHECK(in.dtype() == DType::f32 && in.ndim() == 1, "OffloadedState::write_range: ", in.str());
  for_range(g, a, shard_offset, in.numel(), true, [&](const Tensor& array, int64_t lo, int64_t hi, int64_t at) {
    kernels::copy(array.slice(0, lo, hi - lo), in.slice(0, at, hi - lo));
  });
}

}  // namespace loom::parallel
