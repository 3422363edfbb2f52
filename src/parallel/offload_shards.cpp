// OffloadedShards (offload.h): ZeRO-3's parameter and gradient shards in an
// offload file, two records per extent of the optimizer's state, moved
// through kSlots slots of each kind.
#include <algorithm>

#include "core/error.h"
#include "parallel/offload.h"

namespace loom::parallel {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// An extent's most elements for a shard of S elements (OffloadedState's slots).
int64_t slot_elements(int64_t S, int64_t budget_bytes, int arrays) {
  return std::min(OffloadedState::chunk_elements(budget_bytes, arrays),
                  round_up(std::max<int64_t>(S, 1), OffloadedState::kGrain));
}

}  // namespace

int64_t OffloadedShards::buffer_bytes(Kind kind, int64_t S, int64_t budget_bytes, int arrays, int64_t elem_bytes,
                                      const DiskOffload& o) {
  const int64_t n = slot_elements(S, budget_bytes, arrays);
  const int64_t slots = kSlots * round_up(n * elem_bytes, io::kOffloadAlign) + io::kOffloadAlign;
  // The gradients' records are the larger: the bounce buffers hold them.
  return kind == kParams ? slots : slots + (o.direct ? io::OffloadFile::bounce_buffer_bytes(o.threads, 4 * n) : 0);
}

OffloadedShards::OffloadedShards(const OffloadedState& state, DType compute, const DiskOffload& o, Pool& params,
                                 Pool& grads)
    : compute_(compute) {
  const int64_t elem[2] = {static_cast<int64_t>(dtype_size(compute)), 4};
  std::vector<int64_t> records;
  int64_t S = 0;
  for (const OffloadedState::Extent& e : state.extents()) {
    S += e.piece.count;
    for (const int64_t b : elem) records.push_back(e.piece.count * b);
  }
  const int64_t n = slot_elements(S, o.budget_bytes, state.arrays());
  Pool* pools[2] = {&params, &grads};
  for (int kind = 0; kind < 2; ++kind) {
    const int64_t slot_bytes = round_up(n * elem[kind], io::kOffloadAlign);
    buffers_[kind] = pools[kind]->empty(DType::u8, {kSlots * slot_bytes + io::kOffloadAlign});
    uint8_t* base = Tensor(buffers_[kind]).data_as<uint8_t>();
    const auto at = static_cast<int64_t>(reinterpret_cast<uintptr_t>(base));
    base += round_up(at, io::kOffloadAlign) - at;  // O_DIRECT: 4 KiB aligned
    for (int k = 0; k < kSlots; ++k) slots_[kind][k].data = base + k * slot_bytes;
  }
  io::OffloadFile::Options fo{o.path + ".params", o.direct, o.threads};
  if (o.direct) fo.bounce_pool = &grads, fo.bounce_bytes = 4 * n;
  file_ = std::make_unique<io::OffloadFile>(fo, std::move(records));
}

OffloadedShards::~OffloadedShards() {
  try {
    drain();
  } catch (...) {  // an error already reported, or one nobody waits for: the file goes anyway
  }
}

Tensor OffloadedShards::slot(Kind kind, int k, int64_t count) {
  Slot& sl = slots_[kind][k];
  if (sl.io.valid()) {
    const io::OffloadFile::Io io = std::move(sl.io);
    sl.io = {}, sl.record = -1, sl.writing = false;
    io::OffloadFile::wait(io);
  }
  return Tensor(sl.data, kind == kParams ? compute_ : DType::f32, {count});
}

void OffloadedShards::wait_writes_of(int64_t r) {
  for (Slot(&kind)[kSlots] : slots_)
    for (Slot& sl : kind)
      if (sl.io.valid() && sl.writing && sl.record == r) {
        const io::OffloadFile::Io io = std::move(sl.io);
        sl.io = {}, sl.record = -1, sl.writing = false;
        io::OffloadFile::wait(io);
      }
}

void OffloadedShards::read(Kind kind, int k, int64_t e) {
  const int64_t r = 2 * e + kind;
  (void)slot(kind, k, 0);  // the slot's own I/O done
  wait_writes_of(r);
  Slot& sl = slots_[kind][k];
  sl.io = file_->read(r, sl.data), sl.record = r, sl.writing = false;
}

void OffloadedShards::write(Kind kind, int k, int64_t e) {
  Slot& sl = slots_[kind][k];
  LOOM_CHECK(!sl.io.valid(), "OffloadedShards::write: slot ", k, " has I/O in flight");
  const int64_t r = 2 * e + kind;
  sl.io = file_->write(r, sl.data), sl.record = r, sl.writing = true;
}

io::OffloadFile::Io OffloadedShards::read_into(Kind kind, int64_t e, const Tensor& dst) {
  const int64_t r = 2 * e + kind;
  LOOM_CHECK(dst.is_contiguous() &&
                 dst.numel() * static_cast<int64_t>(dtype_size(dst.dtype())) == file_->record_bytes(r),
             "OffloadedShards::read_into: ", dst.str(), " for a record of ", file_->record_bytes(r), " bytes");
  wait_writes_of(r);
  return file_->read_exact(r, dst.data());
}

void OffloadedShards::drain() {
  std::exception_ptr first;
  for (Slot(&kind)[kSlots] : slots_)
    for (Slot& sl : kind) {
      if (!sl.io.valid()) continue;
      const io::OffloadFile::Io io = std::move(sl.io);
      sl.io = {}, sl.record = -1, sl.writing = false;
      try {
        io::OffloadFile::wait(io);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
  if (first) std::rethrow_exception(first);
}

}  // namespace loom::parallel
