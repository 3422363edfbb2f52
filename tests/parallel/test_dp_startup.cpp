// Data parallelism's layout of a deep model is linear in its layers (issue
// 15, defect 7): ZeRO-3 makes one bucket per unit, and cutting each rank's
// segments at parameter boundaries finds every segment's first parameter by
// binary search instead of scanning every parameter per bucket. At 100000
// layers a scan per bucket would not finish within the test's timeout; the
// test checks sizes and invariants, not time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "comm/self_communicator.h"
#include "core/memory.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/dp.h"

namespace loom::parallel {
namespace {

TEST(DpLayout, Zero3PiecesOfA100000LayerModelCutEverySegmentAtItsParameters) {
  model::ModelConfig c = model::model_preset("gpt2-tiny");
  c.n_layer = 100000, c.n_embd = 8, c.n_head = 2, c.n_kv_head = 2, c.d_ff = 16, c.vocab_size = 64;
  const std::vector<model::ParamSpec> specs = model::param_specs(c);
  const std::vector<model::Unit> units = model::model_units(c, specs);
  const std::vector<Bucket> buckets = make_buckets(units, 3, 25.0);
  ASSERT_EQ(buckets.size(), units.size());
  for (int size : {1, 3}) {
    const int rank = size - 1;
    const std::vector<Segment> segments = shard_segments(buckets, 3, size, rank);
    const std::vector<ParamPiece> pieces = segment_pieces(segments, specs);
    int64_t shard = 0;
    for (const Segment& s : segments) shard += s.count;
    // The pieces tile the shard in order, each inside one parameter, and
    // decay exactly the 2-D ones.
    int64_t at = 0;
    size_t spec = 0;
    for (const ParamPiece& p : pieces) {
      ASSERT_EQ(p.shard_offset, at);
      ASSERT_GT(p.count, 0);
      while (specs[spec].offset + specs[spec].numel() <= p.offset) ++spec;
      ASSERT_LE(specs[spec].offset, p.offset);
      ASSERT_LE(p.offset + p.count, specs[spec].offset + specs[spec].numel());
      ASSERT_EQ(p.decay, specs[spec].shape.ndim() >= 2);
      at += p.count;
    }
    EXPECT_EQ(at, shard);
    // A group of one holds every parameter whole: one piece each.
    if (size == 1) {
      EXPECT_EQ(pieces.size(), specs.size());
    }
  }
}

// A ZeRO-3 model holds no parameters of its own, so a very wide one fits;
// its optimizer state (5 x 10^13 parameters in one rank's shard) does not,
// and DataParallel says so before allocating any of it.
TEST(DpMemory, OptimizerStateLargerThanMemoryIsRefusedBeforeItIsAllocated) {
  model::ModelConfig c = model::model_preset("gpt2-tiny");
  c.n_layer = 4, c.n_embd = 1 << 20, c.n_head = 4, c.n_kv_head = 4, c.d_ff = 4 << 20, c.vocab_size = 64;
  Pools pools;
  model::Model m(c, 1, 1, pools, {.storage = DataParallel::model_storage(3)});
  std::string msg;
  try {
    comm::SelfCommunicator alone;
    DataParallel dp(m, alone, alone, {.zero_stage = 3}, pools);
  } catch (const Error& e) {
    msg = e.what();
  }
  for (const char* part : {"the training state of ", " parameters on this rank (optimizer state, gradient shard, "
                           "parameter shard) and the model's bookkeeping needs ", " GiB but this machine has ", "fits in memory"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
  const MemoryReport r = pools.report();
  EXPECT_EQ(r[MemTag::optimizer].peak, 0u);
  EXPECT_EQ(r[MemTag::grads].peak, 0u);
  EXPECT_EQ(r[MemTag::params].peak, 0u);
}

}  // namespace
}  // namespace loom::parallel
