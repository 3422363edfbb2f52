#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

using namespace loom;

TEST(Tensor, ContiguousStridesAreRowMajor) {
  std::vector<float> buf(2 * 3 * 4);
  Tensor t(buf.data(), DType::f32, {2, 3, 4});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.str(), "f32(2, 3, 4)");
}

TEST(Tensor, DefaultIsUndefined) {
  EXPECT_FALSE(Tensor().defined());
  float x = 0;
  EXPECT_TRUE(Tensor(&x, DType::f32, {1}).defined());
}

TEST(Tensor, FiveDimsAllowedSixRejected) {
  EXPECT_NO_THROW((Shape{1, 2, 3, 4, 5}));
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6}), Error);
}

TEST(Tensor, SliceOuterDimStaysContiguousAndSharesMemory) {
  std::vector<float> buf(24);
  std::iota(buf.begin(), buf.end(), 0.f);
  Tensor t(buf.data(), DType::f32, {2, 3, 4});
  Tensor s = t.slice(0, 1, 1);
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.data_as<float>()[0], 12.f);
  s.data_as<float>()[0] = -1.f;
  EXPECT_EQ(buf[12], -1.f);
}

TEST(Tensor, SliceInnerDimIsStridedView) {
  std::vector<float> buf(24);
  std::iota(buf.begin(), buf.end(), 0.f);
  Tensor t(buf.data(), DType::f32, {2, 3, 4});
  Tensor s = t.slice(1, 1, 2);  // (2, 2, 4), rows 1..2 of each batch
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.stride(0), 12);
  EXPECT_EQ(s.data_as<float>()[0], 4.f);
  EXPECT_EQ(s.data_as<float>()[s.stride(0)], 16.f);
  Tensor last = t.slice(2, 3, 1);  // (2, 3, 1)
  EXPECT_EQ(last.data_as<float>()[last.stride(1)], 7.f);
  EXPECT_THROW(s.reshape({16}), Error);
}

TEST(Tensor, SliceOutOfRangeIsAnError) {
  std::vector<float> buf(6);
  Tensor t(buf.data(), DType::f32, {2, 3});
  EXPECT_THROW(t.slice(1, 2, 2), Error);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
  EXPECT_THROW(t.slice(0, -1, 1), Error);
}

TEST(Tensor, ReshapeKeepsElementsAndInfersOneExtent) {
  std::vector<uint16_t> buf(24);
  Tensor t(buf.data(), DType::bf16, {2, 3, 4});
  Tensor r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.data(), t.data());
  EXPECT_EQ(r.dtype(), DType::bf16);
  EXPECT_EQ(t.flatten().shape(), (Shape{24}));
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_THROW(t.reshape({7, -1}), Error);
}

TEST(Tensor, SingletonDimsDoNotBreakContiguity) {
  std::vector<float> buf(8);
  Tensor t(buf.data(), DType::f32, {1, 2, 1, 4});
  EXPECT_TRUE(t.slice(0, 0, 1).is_contiguous());
  EXPECT_TRUE(t.slice(1, 1, 1).is_contiguous());
}

TEST(Tensor, ShapeValidationRejectsNegativeAndOverflowingExtents) {
  EXPECT_THROW((Shape{2, -3}).validate(), Error);
  EXPECT_THROW((Shape{int64_t{1} << 32, int64_t{1} << 32}).validate(), Error);
  EXPECT_NO_THROW((Shape{int64_t{1} << 31, int64_t{1} << 31}).validate());
  float x = 0;
  EXPECT_THROW(Tensor(&x, DType::f32, {int64_t{1} << 40, int64_t{1} << 40}), Error);
}
