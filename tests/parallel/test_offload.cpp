// The optimizer's disk tier (parallel/offload.h): pieces cut into extents at
// multiples of kGrain from each piece's start; a stream visits them in
// order with what earlier streams left; ranges read and written across
// extents; the buffers a budget allows, and a budget below the least
// refused with the numbers. The parameters' tier's records (OffloadedShards)
// through its slots and into any slice.
#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "parallel/offload.h"

namespace loom::parallel {
namespace {

std::string temp_file(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / ("loom_offload_state_" + name)).string();
}

TEST(OffloadedState, ExtentsCutPiecesAtTheGrainAndStreamsKeepWhatTheyWrote) {
  constexpr int64_t G = OffloadedState::kGrain;
  const int64_t budget = OffloadedState::kSlots * 4 * 3 * (2 * G) + 4096;  // chunks of 2 grains, 3 arrays
  ASSERT_EQ(OffloadedState::chunk_elements(budget, 3), 2 * G);
  // Group 0: pieces of 5 grains + 7 and of 3; group 1: one of 100.
  const std::vector<std::vector<ParamPiece>> pieces = {
      {{1000, 5 * G + 7, 0, true}, {1000 + 5 * G + 7, 3, 5 * G + 7, false}}, {{0, 100, 0, true}}};
  Pools pools;
  OffloadedState state(pieces, 3, {true, temp_file("extents"), budget, true, 2}, pools[MemTag::optimizer]);
  std::vector<std::pair<int64_t, int64_t>> seen;  // (shard offset, count) of group 0's extents
  for (const OffloadedState::Extent& e : state.extents())
    if (e.group == 0) seen.emplace_back(e.piece.shard_offset, e.piece.count);
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {0, 2 * G}, {2 * G, 2 * G}, {4 * G, G + 7}, {5 * G + 7, 3}};
  EXPECT_EQ(seen, want);
  EXPECT_EQ(state.extents().back().group, 1);
  EXPECT_EQ(static_cast<int64_t>(pools.report()[MemTag::optimizer].current),
            OffloadedState::buffer_bytes(5 * G + 7 + 3 + 100, budget, 3));
  // Each element of array a gets a * 1e6 + its shard offset (per group), then + 1 in a second stream.
  for (int pass = 0; pass < 2; ++pass)
    state.stream([&](const OffloadedState::Extent& e, std::span<const Tensor> arrays) {
      for (int a = 0; a < 3; ++a) {
        auto* x = arrays[static_cast<size_t>(a)].data_as<float>();
        for (int64_t i = 0; i < e.piece.count; ++i) {
          const float value = static_cast<float>(a * 1000000 + e.group * 500000 + e.piece.shard_offset + i);
          if (pass == 0) EXPECT_EQ(x[i], 0.f) << "a record never written reads as zeros";
          else ASSERT_EQ(x[i], value) << "group " << e.group << " array " << a << " element " << i;
          x[i] = pass == 0 ? value : value + 1;
        }
      }
    });
  // A range across three extents of group 0, array 2: read, changed, written, read again.
  std::vector<float> got(static_cast<size_t>(3 * G));
  const Tensor range(got.data(), DType::f32, {3 * G});
  state.read_range(0, 2, G + 5, range);
  for (int64_t i = 0; i < 3 * G; ++i) ASSERT_EQ(got[i], static_cast<float>(2000000 + G + 5 + i + 1)) << i;
  for (float& x : got) x = -x;
  state.write_range(0, 2, G + 5, range);
  std::vector<float> whole(static_cast<size_t>(5 * G + 10));
  state.read_range(0, 2, 0, Tensor(whole.data(), DType::f32, {5 * G + 10}));
  for (int64_t i = 0; i < 5 * G + 10; ++i) {
    const float before = static_cast<float>(2000000 + i + 1);
    ASSERT_EQ(whole[i], i >= G + 5 && i < 4 * G + 5 ? -before : before) << i;
  }
  std::vector<float> other(100);
  state.read_range(1, 0, 0, Tensor(other.data(), DType::f32, {100}));
  EXPECT_EQ(other[99], static_cast<float>(500000 + 99 + 1)) << "group 1 kept its values";
}

// The parameters' tier (OffloadedShards): two records per extent of the
// state, slots of a chunk; records round-trip through the slots and into a
// tensor slice anywhere (read_into, with and without O_DIRECT), a read
// waits for the write of its record still in flight, and a stream's hooks
// bring each extent's records into the slots of its index.
TEST(OffloadedShards, RecordsRoundTripThroughSlotsIntoAnySliceAndBesideTheStream) {
  constexpr int64_t G = OffloadedState::kGrain;
  const int64_t budget = OffloadedState::kSlots * 4 * 2 * G + 4096;  // chunks of one grain, 2 arrays
  const std::vector<std::vector<ParamPiece>> pieces = {{{0, 2 * G + 5, 0, true}, {2 * G + 5, 7, 2 * G + 5, false}},
                                                       {{0, 3, 0, true}}};
  for (bool direct : {false, true}) {
    Pools pools;
    DiskOffload o{true, temp_file("shards"), budget, direct, 2};
    o.params = true;
    {
      OffloadedState state(pieces, 2, o, pools[MemTag::optimizer]);
      ASSERT_EQ(state.extents().size(), 5u);  // G, G, 5, 7 and 3 elements
      OffloadedShards sh(state, DType::bf16, o, pools[MemTag::params], pools[MemTag::grads]);
      const int64_t S = 2 * G + 15;
      EXPECT_EQ(static_cast<int64_t>(pools.report()[MemTag::params].current),
                OffloadedShards::buffer_bytes(OffloadedShards::kParams, S, budget, 2, 2, o));
      EXPECT_EQ(static_cast<int64_t>(pools.report()[MemTag::grads].current),
                OffloadedShards::buffer_bytes(OffloadedShards::kGrads, S, budget, 2, 4, o));
      EXPECT_EQ(OffloadedShards::buffer_bytes(OffloadedShards::kParams, S, budget, 2, 2, o), 4 * 2 * G + 4096);
      EXPECT_EQ(OffloadedShards::buffer_bytes(OffloadedShards::kGrads, S, budget, 2, 4, o),
                4 * 4 * G + 4096 + (direct ? 2 * (4 * G + 4096) : 0));
      EXPECT_TRUE(std::filesystem::exists(temp_file("shards") + ".params"));
      const auto value = [](int64_t e, int kind, int64_t i) { return static_cast<float>(e * 1000 + kind * 500 + i % 100); };
      for (int64_t e = 0; e < 5; ++e)
        for (int kind = 0; kind < 2; ++kind) {
          const auto k = static_cast<OffloadedShards::Kind>(kind);
          const int64_t n = state.extents()[static_cast<size_t>(e)].piece.count;
          const Tensor slot = sh.slot(k, static_cast<int>(e % 4), n);
          for (int64_t i = 0; i < n; ++i) {
            if (kind == OffloadedShards::kGrads) slot.data_as<float>()[i] = value(e, kind, i);
            else slot.data_as<uint16_t>()[i] = static_cast<uint16_t>(value(e, kind, i));
          }
          sh.write(k, static_cast<int>(e % 4), e);  // read_into below waits for it
        }
      for (int64_t e = 0; e < 5; ++e) {
        const int64_t n = state.extents()[static_cast<size_t>(e)].piece.count;
        std::vector<float> grads(static_cast<size_t>(n + 3));
        io::OffloadFile::wait(sh.read_into(OffloadedShards::kGrads, e, Tensor(grads.data() + 3, DType::f32, {n})));
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(grads[3 + i], value(e, 1, i)) << e << " " << i;
      }
      // A stream: extent i's records in slots i % 4, the parameters written back (+1).
      int64_t visited = 0;
      state.stream(
          [&](const OffloadedState::Extent& ex, std::span<const Tensor>) {
            const int64_t e = &ex - state.extents().data();
            const Tensor g = sh.slot(OffloadedShards::kGrads, static_cast<int>(e % 4), ex.piece.count);
            const Tensor p = sh.slot(OffloadedShards::kParams, static_cast<int>(e % 4), ex.piece.count);
            for (int64_t i = 0; i < ex.piece.count; ++i) {
              ASSERT_EQ(g.data_as<float>()[i], value(e, 1, i)) << e << " " << i;
              ASSERT_EQ(p.data_as<uint16_t>()[i], static_cast<uint16_t>(value(e, 0, i))) << e << " " << i;
              p.data_as<uint16_t>()[i] += 1;
            }
            ++visited;
          },
          {[&](int64_t i, int k) {
             sh.read(OffloadedShards::kParams, k, i);
             sh.read(OffloadedShards::kGrads, k, i);
           },
           [&](int64_t i, int k) { sh.write(OffloadedShards::kParams, k, i); }});
      EXPECT_EQ(visited, 5);
      for (int64_t e = 0; e < 5; ++e) {
        const int64_t n = state.extents()[static_cast<size_t>(e)].piece.count;
        std::vector<uint16_t> params(static_cast<size_t>(n + 1));
        io::OffloadFile::wait(sh.read_into(OffloadedShards::kParams, e, Tensor(params.data() + 1, DType::bf16, {n})));
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(params[1 + i], static_cast<uint16_t>(static_cast<uint16_t>(value(e, 0, i)) + 1)) << e << " " << i;
      }
    }
    EXPECT_FALSE(std::filesystem::exists(temp_file("shards") + ".params")) << "the file outlived its object";
    EXPECT_EQ(pools.report()[MemTag::params].current, 0u);
  }
}

TEST(OffloadedState, ABudgetBelowFourRecordsOfAGrainIsRefused) {
  try {
    (void)OffloadedState::chunk_elements(100000, 2);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a budget of 100000 bytes is below the least the offloaded state streams "
                                         "through: 4 buffers of 4096 "
                                         "elements x 2 f32 arrays (and 4 KiB to align them) = 135168 bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LE(OffloadedState::buffer_bytes(int64_t{1} << 30, 64 << 20, 3), 64 << 20);
  EXPECT_EQ(OffloadedState::buffer_bytes(10, 64 << 20, 2), 4 * 32768 + 4096) << "a small shard: records of a grain";
}

}  // namespace
}  // namespace loom::parallel
