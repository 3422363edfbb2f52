#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"

using namespace loom;

TEST(Memory, AllocationsAre64ByteAligned) {
  Pools pools;
  for (size_t bytes : {1u, 3u, 64u, 100u, 4097u}) {
    Storage s = pools[MemTag::workspace].allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << bytes;
  }
}

TEST(Memory, CurrentAndPeakPerTag) {
  Pools pools;
  {
    OwnedTensor p = pools[MemTag::params].empty(DType::f32, {10, 10});  // 400 B
    OwnedTensor g = pools[MemTag::grads].zeros(DType::bf16, {10, 10});  // 200 B
    {
      OwnedTensor a = pools[MemTag::activations].empty(DType::f32, {1000});  // 4000 B
      const MemoryReport r = pools.report();
      EXPECT_EQ(r[MemTag::params].current, 400u);
      EXPECT_EQ(r[MemTag::grads].current, 200u);
      EXPECT_EQ(r[MemTag::activations].current, 4000u);
      EXPECT_EQ(r.current_total, 4600u);
    }
    OwnedTensor a2 = pools[MemTag::activations].empty(DType::f32, {500});  // 2000 B
    const MemoryReport r = pools.report();
    EXPECT_EQ(r[MemTag::activations].current, 2000u);
    EXPECT_EQ(r[MemTag::activations].peak, 4000u);
    EXPECT_EQ(r.peak_total, 4600u);
    EXPECT_EQ(r[MemTag::optimizer].peak, 0u);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(static_cast<uint16_t*>(g.data())[i], 0u);
  }
  const MemoryReport r = pools.report();
  EXPECT_EQ(r.current_total, 0u);
  EXPECT_EQ(r[MemTag::params].peak, 400u);
  pools.reset_peaks();
  EXPECT_EQ(pools.report().peak_total, 0u);
}

TEST(Memory, MovedStorageIsFreedOnce) {
  Pools pools;
  Storage a = pools[MemTag::comm].allocate(128);
  Storage b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(pools.report()[MemTag::comm].current, 128u);
  b.release();
  EXPECT_EQ(pools.report()[MemTag::comm].current, 0u);
}

TEST(Memory, ReportPrintsTableAndJsonWithEveryTag) {
  Pools pools;
  OwnedTensor kv = pools[MemTag::kv_cache].empty(DType::bf16, {1024});
  const MemoryReport r = pools.report();
  const std::string table = r.table();
  for (const char* tag : {"params", "grads", "master", "optimizer", "activations", "comm", "kv_cache", "workspace",
                          "total"})
    EXPECT_NE(table.find(tag), std::string::npos) << tag;
  const auto j = nlohmann::json::parse(r.json());
  EXPECT_EQ(j["kv_cache"]["current_bytes"], 2048);
  EXPECT_EQ(j["kv_cache"]["peak_bytes"], 2048);
  EXPECT_EQ(j["total"]["current_bytes"], 2048);
  EXPECT_EQ(j.size(), 9u);
}

TEST(Memory, OwnedTensorIsATensorView) {
  Pools pools;
  OwnedTensor t = pools[MemTag::params].zeros(DType::f32, {4, 8});
  const Tensor& v = t;
  EXPECT_EQ(v.shape(), (Shape{4, 8}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.slice(0, 2, 1).data_as<float>(), t.data_as<float>() + 16);
}

TEST(Memory, NegativeOrOverflowingShapesAreErrorsAndLeaveTheReportClean) {
  Pools pools;
  EXPECT_THROW(pools[MemTag::activations].empty(DType::f32, {-1, 4}), Error);
  EXPECT_THROW(pools[MemTag::activations].empty(DType::f32, {int64_t{1} << 40, int64_t{1} << 40}), Error);
  EXPECT_THROW(pools[MemTag::activations].empty(DType::f32, {int64_t{1} << 62}), Error);  // 2^64 bytes
  EXPECT_THROW(pools[MemTag::activations].allocate(SIZE_MAX - 8), Error);
  const MemoryReport r = pools.report();
  EXPECT_EQ(r[MemTag::activations].peak, 0u);
  EXPECT_EQ(r.peak_total, 0u);
}
