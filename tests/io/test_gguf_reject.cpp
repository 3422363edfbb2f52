// GGUF reader: one crafted file per validation rule, built by hand from the
// spec, each refused with a loom::Error naming the file, the field and the
// value; among them the shapes of the published llama.cpp / ollama GGUF
// advisories (huge string and array lengths, tensor size overflow through
// the dims, dimension wrap, bad alignment, a vocabulary of the wrong element
// type, duplicate names, zero-size dims).
#include "io/gguf_test_util.h"

namespace loom::io {
namespace {

using namespace gguf_test;

constexpr uint64_t kHuge = 0xffffffffffffff00ull;

TEST(GgufReject, AFileThatIsNotGguf) {
  expect_rejected(Bytes{'G', 'G'}, {"2 bytes: too short"});
  expect_rejected(Builder().raw("GGML").u32(3).u64(0).u64(0).b, {"not a GGUF file", "\"GGML\""});
  expect_rejected(Builder().raw("GGUF").u32(3).b, {"tensor_count needs 8 bytes at offset 8"});
}

TEST(GgufReject, Version1ByteSwappedAndUnknownVersions) {
  expect_rejected(Builder().header(0, 0, 1).b, {"version 1 is not supported"});
  expect_rejected(Builder().header(0, 0, 0x03000000).b, {"0x3000000", "big-endian (byte-swapped)"});
  expect_rejected(Builder().header(0, 0, 4).b, {"version 4 is not supported: loom reads versions 2 and 3"});
  expect_rejected(Builder().header(0, 0, 0).b, {"version 0 is not supported"});
}

TEST(GgufReject, CountsLargerThanTheFileCanHold) {
  expect_rejected(Builder().header(0, 3).kv_u32("a", 1).b, {"kv_count = 3 cannot be right", "at least 14 bytes"});
  expect_rejected(Builder().header(kHuge, 0).b, {"tensor_count = 18446744073709551360 cannot be right"});
  expect_rejected(Builder().header(0, kHuge).b, {"kv_count = 18446744073709551360"});
}

TEST(GgufReject, HugeStringLengths) {
  expect_rejected(Builder().header(0, 1).u64(kHuge).raw("general.name").u32(kU8).u8(0).b,
                  {"key-value pair #0 key: string length 18446744073709551360 exceeds the"});
  expect_rejected(Builder().header(0, 1).str("general.name").u32(kString).u64(1ull << 40).raw("x").b,
                  {"key 'general.name': string length 1099511627776 exceeds the 1 bytes left"});
  expect_rejected(Builder().header(0, 1).kv_array("x.s", kString, 2).str("ok").u64(kHuge).b,
                  {"key 'x.s'[1]: string length 18446744073709551360"});
}

TEST(GgufReject, HugeArrayLengths) {
  expect_rejected(Builder().header(0, 1).kv_array("tokenizer.ggml.tokens", kString, 1ull << 61).str("a").b,
                  {"key 'tokenizer.ggml.tokens': array length 2305843009213693952 cannot be right",
                   "each string element takes at least 8 bytes"});
  expect_rejected(Builder().header(0, 1).kv_array("x.u64", kU64, kHuge).u64(1).b, {"array length"});
  expect_rejected(Builder().header(0, 1).kv_array("x.u8", kU8, 5).u8(1).u8(2).b,
                  {"key 'x.u8': array length 5 cannot be right"});
}

TEST(GgufReject, UnknownValueTypes) {
  expect_rejected(Builder().header(0, 1).str("x.k").u32(13).u32(0).b, {"key 'x.k': unknown value type 13"});
  expect_rejected(Builder().header(0, 1).kv_array("x.k", 0xffffffffu, 0).b,
                  {"key 'x.k': unknown array element type 4294967295"});
  expect_rejected(Builder().header(0, 1).str("x.b").u32(kBool).u8(2).b, {"key 'x.b': bool value 2"});
  expect_rejected(Builder().header(0, 1).kv_array("x.b", kBool, 2).u8(1).u8(7).b, {"key 'x.b'[1]: bool value 7"});
}

TEST(GgufReject, ArraysNestedDeeperThanFour) {
  auto nested = [](int levels) {
    Builder f;
    f.header(0, 1).str("x.n").u32(kArray);
    for (int i = 1; i < levels; ++i) f.u32(kArray).u64(1);
    f.u32(kU8).u64(1).u8(9);
    return f.b;
  };
  const GgufFile ok = open_bytes(nested(4));
  EXPECT_EQ(ok.value("x.n").type_description(), "array of array");
  expect_rejected(nested(5), {"key 'x.n'[0][0][0][0]: arrays nested 5 deep (loom reads at most 4)"});
}

TEST(GgufReject, BadKeys) {
  expect_rejected(Builder().header(0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2).b,
                  {"duplicate key 'a.b' (pairs #0 and #1)"});
  expect_rejected(Builder().header(0, 1).kv_u32("", 1).b, {"key-value pair #0 has an empty key"});
  expect_rejected(Builder().header(0, 1).kv_u32(std::string(65536, 'k'), 1).b,
                  {"is 65536 bytes (at most 65535)"});
  expect_rejected(Builder().header(0, 1).kv_u32("caf\xc3\xa9", 1).b, {"key 'caf\\xc3\\xa9' is not ASCII (byte 3)"});
}

TEST(GgufReject, VocabularyOfTheWrongElementTypeOrLength) {
  expect_rejected(Builder().header(0, 1).kv_array("tokenizer.ggml.tokens", kI32, 1).u32(5).b,
                  {"key 'tokenizer.ggml.tokens' is array of i32, but this key must be array of string"});
  expect_rejected(Builder().header(0, 1).kv_array("tokenizer.ggml.scores", kF64, 0).b,
                  {"is array of f64, but this key must be array of f32"});
  expect_rejected(Builder().header(0, 1).kv_array("tokenizer.ggml.token_type", kU8, 1).u8(1).b,
                  {"is array of u8, but this key must be array of i32"});
  expect_rejected(Builder().header(0, 1).kv_str("tokenizer.ggml.tokens", "a").b,
                  {"is string, but this key must be array of string"});
  expect_rejected(Builder()
                      .header(0, 2)
                      .kv_array("tokenizer.ggml.tokens", kString, 2)
                      .str("a")
                      .str("b")
                      .kv_array("tokenizer.ggml.token_type", kI32, 1)
                      .u32(1)
                      .b,
                  {"tokenizer.ggml.token_type has 1 entries but tokenizer.ggml.tokens has 2"});
}

TEST(GgufReject, BadAlignment) {
  for (uint32_t a : {0u, 4u, 48u, 0x80000001u}) {
    Builder f;
    f.header(1, 1).kv_u32("general.alignment", a).tensor("w", {1}, kTF32, 0).pad(64).data(4);
    expect_rejected(f.b, {concat("general.alignment = ", a, " must be a power of two and a multiple of 8")});
  }
  expect_rejected(Builder().header(0, 1).str("general.alignment").u32(kI32).u32(32).b,
                  {"key 'general.alignment' is i32, but this key must be u32"});
}

TEST(GgufReject, BadTensorNames) {
  Builder dup;
  dup.header(2, 0).tensor("w", {1}, kTF32, 0).tensor("w", {1}, kTF32, 32).pad(32).data(64);
  expect_rejected(dup.b, {"duplicate tensor name 'w' (tensors #0 and #1)"});
  expect_rejected(Builder().header(1, 0).tensor("", {1}, kTF32, 0).pad(32).data(4).b,
                  {"tensor #0 has an empty name"});
  expect_rejected(Builder().header(1, 0).tensor(std::string(65, 'n'), {1}, kTF32, 0).pad(32).data(4).b,
                  {"is 65 bytes (at most 64)"});
  const GgufFile ok = open_bytes(Builder().header(1, 0).tensor(std::string(64, 'n'), {1}, kTF32, 0).pad(32).data(4).b);
  EXPECT_EQ(ok.tensors()[0].name.size(), 64u);
}

TEST(GgufReject, DimensionCountsOutsideOneToFour) {
  expect_rejected(Builder().header(1, 0).tensor("w", {}, kTF32, 0).pad(32).data(4).b,
                  {"tensor 'w': n_dims = 0 (must be 1 to 4)"});
  expect_rejected(Builder().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, kTF32, 0).pad(32).data(4).b,
                  {"tensor 'w': n_dims = 5"});
}

TEST(GgufReject, ZeroSizeDimensions) {
  expect_rejected(one_tensor_file({4, 0}, kTF32, 0, 16), {"tensor 'w': ne[1] = 0 (loom refuses empty tensors)"});
  expect_rejected(one_tensor_file({0}, kTF32, 0, 0), {"ne[0] = 0"});
}

TEST(GgufReject, DimensionsThatWrapOrOverflow) {
  expect_rejected(one_tensor_file({1ull << 63}, kTF32, 0, 4), {"ne[0] = 9223372036854775808 is larger than 2^63-1"});
  expect_rejected(one_tensor_file({kHuge}, kTF32, 0, 4), {"ne[0] = 18446744073709551360 is larger"});
  // 2^32 * 2^32 wraps to 0 in 64 bits.
  expect_rejected(one_tensor_file({1ull << 32, 1ull << 32}, kTF32, 0, 4),
                  {"the element count [4294967296, 4294967296] overflows 64 bits"});
  // 2^62 f32 elements fit int64, their 2^64 bytes wrap to 0.
  expect_rejected(one_tensor_file({1ull << 62}, kTF32, 0, 4),
                  {"[4611686018427387904] of f32 is 4611686018427387904 blocks of 4 bytes: more than the whole file"});
  expect_rejected(one_tensor_file({1ull << 40, 4}, kTQ4_K, 0, 4), {"more than the whole file"});
}

TEST(GgufReject, TensorTypesLoomDoesNotSupport) {
  expect_rejected(one_tensor_file({32}, 40, 0, 64), {"tensor 'w': type 40 is not supported (loom reads f32,", "q6_K"});
  expect_rejected(one_tensor_file({256}, 16, 0, 128), {"type 16 (iq2_xxs) is not supported"});
  expect_rejected(one_tensor_file({32}, 4, 0, 64), {"type 4 (q4_2) is not supported"});
  expect_rejected(one_tensor_file({32}, 0xffffffffu, 0, 64), {"type 4294967295 is not supported"});
}

TEST(GgufReject, RowsThatAreNotAWholeNumberOfBlocks) {
  expect_rejected(one_tensor_file({33, 2}, kTQ4_0, 0, 64),
                  {"tensor 'w': type q4_0 stores blocks of 32 values, but ne[0] = 33 is not a multiple of 32"});
  expect_rejected(one_tensor_file({128}, kTQ6_K, 0, 256), {"ne[0] = 128 is not a multiple of 256"});
}

TEST(GgufReject, TensorOffsetsUnalignedOrOutsideTheFile) {
  expect_rejected(one_tensor_file({1}, kTF32, 4, 64), {"tensor 'w': offset 4 is not a multiple of the alignment 32"});
  expect_rejected(one_tensor_file({8}, kTF32, 0, 31), {"its 32 bytes at offset 0 of the data section run past its end",
                                                      "the data section is 31 bytes"});
  expect_rejected(one_tensor_file({1}, kTF32, 1ull << 63, 64), {"at offset 9223372036854775808"});
  expect_rejected(one_tensor_file({1}, kTF32, 0xffffffffffffffe0ull, 64), {"run past its end"});
}

TEST(GgufReject, DataSectionStartingPastTheEndOfTheFile) {
  Builder f;
  f.header(1, 0).tensor("w", {1}, kTF32, 0);  // no padding, no data
  expect_rejected(f.b, {"the data section starts at offset 64", "past the end of the file"});
}

TEST(GgufReject, OverlappingTensors) {
  Builder f;
  f.header(2, 0).tensor("a", {16}, kTF32, 0).tensor("b", {8}, kTF32, 32).pad(32).data(96);
  expect_rejected(f.b, {"tensors 'a' (bytes 0 to 64) and 'b' (from 32) overlap"});
  Builder apart;  // out of order but disjoint: accepted
  apart.header(2, 0).tensor("a", {8}, kTF32, 32).tensor("b", {8}, kTF32, 0).pad(32).data(64);
  const GgufFile ok = open_bytes(apart.b);
  EXPECT_EQ(ok.tensor("a").bytes()[0], 33);
}

TEST(GgufReject, TruncationsEverywhereNameTheFieldBeingRead) {
  Builder f;
  f.header(1, 2)
      .kv_str("general.architecture", "llama")
      .kv_array("x.f", kF32, 2)
      .put(1.0f)
      .put(2.0f)
      .tensor("w", {4, 2}, kTF32, 0)
      .pad(32)
      .data(32);
  ASSERT_NO_THROW(open_bytes(f.b));
  for (size_t n = 0; n < f.b.size(); ++n) {
    const Bytes cut(f.b.begin(), f.b.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      open_bytes(cut, "cut.gguf");
      ADD_FAILURE() << "accepted the first " << n << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace loom::io
