// ZeRO-Infinity's disk tier for the optimizer (DeepSpeed's offload_optimizer
// to NVMe; parallel.offload = optimizer): the shard state a rank's update
// reads and writes once a step — AdamW's moments, and the f32 master
// weights when the model computes in bf16 / f16 — lives in an offload file
// (io/offload_file.h) instead of memory, and streams through a few buffers
// while the update runs.
//
// The shard is cut into extents: each parameter piece of each group
// (DataParallel's ParamPiece, in shard order) in runs of at most `chunk`
// elements, cut at multiples of 4096 from the piece's start, so the update
// kernel sees each element in the same lanes and chunks as it does on a
// whole piece (the results are bitwise those of the in-memory state). An
// extent is one record of the file: its `arrays` f32 arrays back to back.
//
// stream() visits every extent in order with its record resident: records
// are read ahead (slots - 2 in flight) and written back behind, in
// `slots` buffers of one record each: the memory the state takes in the
// run, whatever the model's size (budget_bytes, parallel.offload_budget_mb).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "io/offload_file.h"
#include "parallel/dp_layout.h"

namespace loom::parallel {

struct DiskOffload {
  bool enabled = false;
  std::string path;           // the rank's offload file (and under params, path + ".params")
  int64_t budget_bytes = 0;   // the stream's buffers, all of them
  bool direct = true;         // O_DIRECT where the filesystem has it
  int threads = 2;            // I/O threads
  // parallel.offload = params (ZeRO stage 3): the parameter and gradient
  // shards too, in a second file (OffloadedShards).
  bool params = false;
};

class OffloadedState {
 public:
  static constexpr int kSlots = 4;
  static constexpr int64_t kGrain = 4096;  // extents are cut at multiples of it (elements)
  // The elements an extent holds at most under a budget, for records of
  // `arrays` f32 arrays; a budget below kSlots records of kGrain elements is
  // a loom::Error with the numbers.
  static int64_t chunk_elements(int64_t budget_bytes, int arrays);
  // The bytes of the buffers for a shard of S elements (every group's):
  // kSlots records of min(chunk, S rounded up to kGrain) elements, each
  // rounded to the file's alignment, and one alignment more. At most
  // budget_bytes for any S; what memory plans count.
  static int64_t buffer_bytes(int64_t S, int64_t budget_bytes, int arrays);

  // pieces[g]: group g's pieces in shard order. The buffers come from pool.
  OffloadedState(const std::vector<std::vector<ParamPiece>>& pieces, int arrays, const DiskOffload& o, Pool& pool);
  ~OffloadedState();
  OffloadedState(const OffloadedState&) = delete;
  OffloadedState& operator=(const OffloadedState&) = delete;

  struct Extent {
    int group = 0;
    ParamPiece piece;  // the extent's elements (a run of one of the group's pieces)
  };
  const std::vector<Extent>& extents() const { return extents_; }
  int arrays() const { return arrays_; }
  const io::OffloadFile& file() const { return *file_; }

  // f(extent, its record's arrays as (count) f32 views) for every extent in
  // order; what f leaves in them is written back when write_back. An error
  // (f's, or the file's) waits for the I/O in flight, then propagates.
  using Visit = std::function<void(const Extent&, std::span<const Tensor>)>;
  void stream(const Visit& f, bool write_back = true) { stream(f, write_back, 0, num_extents()); }
  // stream() with more of each extent: hooks.read(i, k) as extent i's
  // record is read into slot k (k = i % kSlots), hooks.write(i, k) as it is
  // written back (OffloadedShards' records in their slots of the same k).
  struct Hooks {
    std::function<void(int64_t i, int k)> read, write;
  };
  void stream(const Visit& f, const Hooks& hooks) { stream(f, true, 0, num_extents(), &hooks); }
  // The chunk: an extent's most elements.
  int64_t chunk() const { return chunk_; }
  // [first, end): the extents of group g that overlap shard elements [shard_offset, + n).
  std::pair<int64_t, int64_t> extents_of(int g, int64_t shard_offset, int64_t n) const;
  // Array a of group g at shard elements [shard_offset, + out.numel()) out
  // of the file, and into it (the other arrays kept): the extents that
  // overlap them only.
  void read_range(int g, int a, int64_t shard_offset, Tensor out);
  void write_range(int g, int a, int64_t shard_offset, const Tensor& in);

 private:
  int64_t num_extents() const { return static_cast<int64_t>(extents_.size()); }
  void stream(const Visit& f, bool write_back, int64_t first, int64_t end, const Hooks* hooks = nullptr);
  // f(extent, its elements [lo, hi) inside [shard_offset, + n), the view's
  // offset) for the extents of group g that overlap them.
  void for_range(int g, int a, int64_t shard_offset, int64_t n, bool write_back,
                 const std::function<void(const Tensor& array, int64_t lo, int64_t hi, int64_t at)>& f);

  int arrays_;
  int64_t chunk_ = 0, slot_bytes_ = 0;
  std::vector<Extent> extents_;
  std::unique_ptr<io::OffloadFile> file_;
  OwnedTensor buffers_;  // kSlots slots of slot_bytes_, from an aligned byte of it
  uint8_t* first_slot_ = nullptr;
};

// parallel.offload = params: ZeRO stage 3's parameter shard (compute
// dtype) and gradient shard (f32) live in a second file, cut as the
// optimizer's state is (OffloadedState's extents): records 2i and 2i + 1
// are extent i's parameters and gradients. A unit's parameters are read
// into its gathered buffer ahead of its use, each reduced gradient is
// read-added-written extent by extent, and the update streams the
// extent's two records beside its state record, in slots of the same
// index. The slots (kSlots of a chunk of each kind) and the I/O threads'
// bounce buffers (exact transfers past the page cache) are the memory the
// shards take.
class OffloadedShards {
 public:
  enum Kind { kParams = 0, kGrads = 1 };
  static constexpr int kSlots = OffloadedState::kSlots;
  // The bytes of one kind's slots (elem_bytes per element) for a shard of S
  // elements under a budget for records of `arrays` f32 arrays, the
  // gradients' with the bounce buffers; what plans count.
  static int64_t buffer_bytes(Kind kind, int64_t S, int64_t budget_bytes, int arrays, int64_t elem_bytes,
                              const DiskOffload& o);

  OffloadedShards(const OffloadedState& state, DType compute, const DiskOffload& o, Pool& params, Pool& grads);
  ~OffloadedShards();
  OffloadedShards(const OffloadedShards&) = delete;
  OffloadedShards& operator=(const OffloadedShards&) = delete;

  const io::OffloadFile& file() const { return *file_; }
  // Slot k of kind as a (count) view (compute dtype or f32), once the I/O
  // it has in flight is done (its error thrown here).
  Tensor slot(Kind kind, int k, int64_t count);
  // Extent e's record of kind into slot k, and out of it: started here,
  // waited for by slot(). A read first waits for the slot's I/O and for a
  // write of the same record still in flight.
  void read(Kind kind, int k, int64_t e);
  void write(Kind kind, int k, int64_t e);
  // The record into dst, a (count) view of its dtype anywhere (a unit's
  // gathered buffer): started here; wait on what it returns.
  io::OffloadFile::Io read_into(Kind kind, int64_t e, const Tensor& dst);
  // Every I/O in flight done; its first error thrown.
  void drain();

 private:
  void wait_writes_of(int64_t record);
  struct Slot {
    uint8_t* data = nullptr;
    int64_t record = -1;  // the record of the I/O in flight
    bool writing = false;
    io::OffloadFile::Io io;
  };
  DType compute_;
  OwnedTensor buffers_[2];  // per kind
  Slot slots_[2][kSlots];
  std::unique_ptr<io::OffloadFile> file_;
};

}  // namespace loom::parallel
