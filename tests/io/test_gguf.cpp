// GGUF: writer -> reader round trips of every value type and several tensor
// types, the writer's layout against a file built by hand from the spec,
// the writer's own checks, and the typed getters' errors. The reader's
// rejections are in test_gguf_reject.cpp, the mutation fuzzing in
// test_gguf_fuzz.cpp.
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "io/gguf_test_util.h"

namespace loom::io {
namespace {

using namespace gguf_test;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

template <typename T>
GgufValue array_of(std::vector<T> v) {
  return GgufValue::array<T>(v);
}

TEST(GgufRoundTrip, EveryValueTypeReadsBackWithItsTypeAndValue) {
  GgufWriter w;
  w.add("t.u8", GgufValue::u8(200));
  w.add("t.i8", GgufValue::i8(-100));
  w.add("t.u16", GgufValue::u16(60000));
  w.add("t.i16", GgufValue::i16(-30000));
  w.add("t.u32", GgufValue::u32(4000000000u));
  w.add("t.i32", GgufValue::i32(-2000000000));
  w.add("t.u64", GgufValue::u64(std::numeric_limits<uint64_t>::max()));
  w.add("t.i64", GgufValue::i64(std::numeric_limits<int64_t>::min()));
  w.add("t.f32", GgufValue::f32(0.1f));
  w.add("t.f64", GgufValue::f64(-1e300));
  w.add("t.bool", GgufValue::boolean(true));
  w.add("t.string", GgufValue::string("h\xc3\xa9llo"));
  w.add("t.empty_string", GgufValue::string(""));
  w.add("t.u8s", array_of<uint8_t>({0, 255}));
  w.add("t.i8s", array_of<int8_t>({-128, 127}));
  w.add("t.u16s", array_of<uint16_t>({1, 65535}));
  w.add("t.i16s", array_of<int16_t>({-32768}));
  w.add("t.u32s", array_of<uint32_t>({7, 8, 9}));
  w.add("t.i32s", array_of<int32_t>({-1, 2}));
  w.add("t.u64s", array_of<uint64_t>({1ull << 40}));
  w.add("t.i64s", array_of<int64_t>({-(1ll << 40)}));
  w.add("t.f32s", array_of<float>({0.5f, -2.0f}));
  w.add("t.f64s", array_of<double>({1.0 / 3}));
  w.add("t.bools", GgufValue::bool_array({true, false, true}));
  const std::vector<std::string> words{"a", "", "\xe2\x96\x81the"};
  w.add("t.strings", GgufValue::string_array(words));
  w.add("t.empty", array_of<int32_t>({}));
  const std::vector<GgufValue> inner{array_of<int32_t>({1, 2}), GgufValue::string_array(words)};
  w.add("t.nested", GgufValue::array_of_arrays(inner));
  const std::string path = temp_path("every_type.gguf");
  w.write(path);

  const GgufFile f = GgufFile::open(path);
  ASSERT_EQ(f.kvs().size(), 27u);
  EXPECT_EQ(f.kvs()[0].key, "t.u8");  // file order
  EXPECT_EQ(f.get_int<uint8_t>("t.u8"), 200);
  EXPECT_EQ(f.get_int<int8_t>("t.i8"), -100);
  EXPECT_EQ(f.get_int<int32_t>("t.u16"), 60000);  // widened
  EXPECT_EQ(f.get_int<int16_t>("t.i16"), -30000);
  EXPECT_EQ(f.get_int<uint32_t>("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_int<int64_t>("t.i32"), -2000000000);
  EXPECT_EQ(f.get_int<uint64_t>("t.u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f.get_int<int64_t>("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(f.get_float("t.f64"), -1e300);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_string("t.empty_string"), "");
  EXPECT_EQ(f.get_int_array("t.u8s"), (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f.get_int_array("t.i8s"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f.get_int_array("t.u16s"), (std::vector<int64_t>{1, 65535}));
  EXPECT_EQ(f.get_int_array("t.i16s"), (std::vector<int64_t>{-32768}));
  EXPECT_EQ(f.get_int_array("t.u32s"), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(f.get_int_array("t.i32s"), (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(f.get_int_array("t.u64s"), (std::vector<int64_t>{1ll << 40}));
  EXPECT_EQ(f.get_int_array("t.i64s"), (std::vector<int64_t>{-(1ll << 40)}));
  EXPECT_EQ(f.get_float_array("t.f32s"), (std::vector<double>{0.5, -2.0}));
  EXPECT_EQ(f.get_float_array("t.f64s"), (std::vector<double>{1.0 / 3}));
  EXPECT_EQ(f.value("t.bools").type_description(), "array of bool");
  EXPECT_EQ(f.value("t.bools").array_size(), 3u);
  const auto strings = f.get_string_array("t.strings");
  EXPECT_EQ(std::vector<std::string>(strings.begin(), strings.end()), words);
  EXPECT_TRUE(f.get_int_array("t.empty").empty());
  const auto nested = f.value("t.nested").as_array_of_arrays("t.nested");
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].as_int_array("[0]"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(nested[1].as_string_array("[1]").size(), 3u);
  EXPECT_TRUE(f.tensors().empty());
}

struct TensorCase {
  const char* name;
  GgmlType type;
  std::vector<int64_t> dims;
};

TEST(GgufRoundTrip, TensorsOfSeveralTypesKeepTheirBytesDimsAndAlignedOffsets) {
  const std::vector<TensorCase> cases{{"token_embd.weight", GgmlType::f32, {8, 3}},
                                      {"blk.0.attn_q.weight", GgmlType::f16, {5}},
                                      {"blk.0.attn_k.weight", GgmlType::bf16, {4, 2, 3}},
                                      {"blk.0.ffn_up.weight", GgmlType::q8_0, {64, 2}},
                                      {"blk.0.ffn_down.weight", GgmlType::q4_0, {32, 1, 1, 3}},
                                      {"blk.0.ffn_gate.weight", GgmlType::q4_K, {256, 2}},
                                      {"output.weight", GgmlType::q6_K, {512}}};
  for (uint32_t alignment : {32u, 64u}) {
    GgufWriter w(alignment);
    w.add("general.architecture", GgufValue::string("llama"));
    w.add("general.quantization_version", GgufValue::u32(2));
    std::vector<std::vector<uint8_t>> data;
    for (size_t i = 0; i < cases.size(); ++i) {
      data.push_back(random_bytes(GgufWriter::tensor_bytes(cases[i].type, cases[i].dims, "t"), i));
      w.add_tensor(cases[i].name, cases[i].type, cases[i].dims, data.back());
    }
    const std::string path = temp_path("tensors.gguf");
    w.write(path);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.has("general.alignment"), alignment != 32);  // absent means 32
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    ASSERT_EQ(f.tensors().size(), cases.size());
    uint64_t expected_offset = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, cases[i].name);
      EXPECT_EQ(t.type, cases[i].type);
      EXPECT_EQ(std::vector<int64_t>(t.dims().begin(), t.dims().end()), cases[i].dims);
      EXPECT_EQ(t.offset, expected_offset) << "packed in the order added";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u);
      EXPECT_EQ(std::vector<uint8_t>(t.bytes().begin(), t.bytes().end()), data[i]) << t.name;
      EXPECT_EQ(&f.tensor(cases[i].name), &t);
      expected_offset += (t.nbytes + alignment - 1) / alignment * alignment;
    }
    EXPECT_EQ(f.file_bytes(), f.data_offset() + expected_offset) << "the last tensor is padded too";
  }
}

TEST(GgufRoundTrip, BlockSizesAndBytesAreGgmlsForEveryType) {
  const std::vector<std::pair<GgmlType, std::pair<int64_t, int64_t>>> expected{
      {GgmlType::f32, {1, 4}},     {GgmlType::f16, {1, 2}},     {GgmlType::bf16, {1, 2}},
      {GgmlType::q4_0, {32, 18}},  {GgmlType::q4_1, {32, 20}},  {GgmlType::q5_0, {32, 22}},
      {GgmlType::q5_1, {32, 24}},  {GgmlType::q8_0, {32, 34}},  {GgmlType::q2_K, {256, 84}},
      {GgmlType::q3_K, {256, 110}}, {GgmlType::q4_K, {256, 144}}, {GgmlType::q5_K, {256, 176}},
      {GgmlType::q6_K, {256, 210}}, {GgmlType::q8_K, {256, 292}}};
  for (const auto& [type, sizes] : expected) {
    const GgmlTypeTraits& t = ggml_type_traits(type);
    EXPECT_EQ(t.block_size, sizes.first) << t.name;
    EXPECT_EQ(t.block_bytes, sizes.second) << t.name;
  }
}

TEST(GgufRoundTrip, FillCallbackStreamsTheTensorBytes) {
  const std::vector<uint8_t> data = random_bytes(34 * 4, 7);
  GgufWriter w;
  w.add("general.quantization_version", GgufValue::u32(2));
  w.add_tensor("q", GgmlType::q8_0, {128}, [&](GgufSink& out) {
    out.write(data.data(), 10);
    out.write(data.data() + 10, data.size() - 10);
  });
  const std::string path = temp_path("fill.gguf");
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(std::vector<uint8_t>(f.tensor("q").bytes().begin(), f.tensor("q").bytes().end()), data);
}

TEST(GgufRoundTrip, AFillWritingTheWrongByteCountLeavesNoFile) {
  for (size_t n : {size_t{3}, size_t{5}}) {
    GgufWriter w;
    w.add_tensor("x", GgmlType::f32, {1}, [n](GgufSink& out) {
      const std::vector<uint8_t> bytes(n);
      out.write(bytes.data(), bytes.size());
    });
    const std::string path = temp_path(concat("short", n, ".gguf"));
    try {
      w.write(path);
      ADD_FAILURE() << "wrote a tensor of " << n << " bytes for 4";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(n < 4 ? "wrote 3 of its 4 bytes" : "more than the tensor's 4 bytes"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}

TEST(GgufWriter, LayoutMatchesAFileBuiltByHandFromTheSpec) {
  Builder expected;
  expected.header(2, 2)
      .kv_str("general.architecture", "gpt2")
      .kv_array("tokenizer.ggml.tokens", kString, 2)
      .str("a")
      .str("bc")
      .tensor("a", {3}, kTF32, 0)
      .tensor("b", {2, 1}, kTF16, 32)
      .pad(32)
      .data(12)
      .pad(32)
      .data(4, 50)
      .pad(32);
  GgufWriter w;
  w.add("general.architecture", GgufValue::string("gpt2"));
  const std::vector<std::string> tokens{"a", "bc"};
  w.add("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  std::vector<uint8_t> a(12), b(4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(1 + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(50 + i);
  w.add_tensor("a", GgmlType::f32, {3}, a);
  w.add_tensor("b", GgmlType::f16, {2, 1}, b);
  const std::string path = temp_path("layout.gguf");
  w.write(path);
  EXPECT_EQ(read_bytes(path), expected.b);
}

TEST(GgufWriter, ValuesCopyUnchangedFromOneFileToAnother) {
  GgufWriter w1;
  const std::vector<GgufValue> inner{array_of<uint8_t>({1}), array_of<double>({2.5})};
  w1.add("x.nested", GgufValue::array_of_arrays(inner));
  w1.add("x.f", GgufValue::f32(-0.0f));
  const std::string p1 = temp_path("copy1.gguf"), p2 = temp_path("copy2.gguf");
  w1.write(p1);
  const GgufFile f1 = GgufFile::open(p1);
  GgufWriter w2;
  for (const GgufKv& kv : f1.kvs()) w2.add(kv.key, kv.value);
  w2.write(p2);
  EXPECT_EQ(read_bytes(p1), read_bytes(p2));
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(GgufWriter, RefusesWhatAReaderWouldRefuse) {
  GgufWriter w;
  w.add("a.b", GgufValue::u8(1));
  expect_error([&] { w.add("a.b", GgufValue::u8(2)); }, "key 'a.b' is added twice");
  expect_error([&] { w.add("", GgufValue::u8(2)); }, "must not be empty");
  expect_error([&] { w.add("k\xc3\xa9", GgufValue::u8(2)); }, "is not ASCII");
  expect_error([&] { w.add(std::string(65536, 'k'), GgufValue::u8(2)); }, "65536 bytes (at most 65535)");
  expect_error([&] { w.add("general.alignment", GgufValue::u32(64)); }, "differs from the writer's alignment 32");
  expect_error([&] { w.add("general.alignment", GgufValue::i32(32)); }, "is i32, but this key must be u32");
  expect_error([&] { w.add("tokenizer.ggml.tokens", array_of<int32_t>({1})); },
               "is array of i32, but this key must be array of string");
  expect_error([] { GgufWriter bad(48); }, "alignment 48 must be a power of two");
  const std::vector<uint8_t> four(4);
  w.add_tensor("t", GgmlType::f32, {1}, four);
  expect_error([&] { w.add_tensor("t", GgmlType::f32, {1}, four); }, "tensor 't' is added twice");
  expect_error([&] { w.add_tensor(std::string(64, 'n'), GgmlType::f32, {1}, four); }, "takes at most 63");
  expect_error([&] { w.add_tensor("u", GgmlType::f32, {}, four); }, "has 0 dimensions");
  expect_error([&] { w.add_tensor("u", GgmlType::f32, {1, 1, 1, 1, 1}, four); }, "has 5 dimensions");
  expect_error([&] { w.add_tensor("u", GgmlType::f32, {0}, four); }, "ne[0] = 0");
  expect_error([&] { w.add_tensor("u", GgmlType::f32, {2}, four); }, "has 4 bytes of data, but its type");
  expect_error([&] { w.add_tensor("u", GgmlType::q4_0, {16}, four); }, "not a multiple of 32");
  expect_error([&] { w.add_tensor("u", GgmlType::f32, {1ll << 62, 4}, four); }, "element count overflows");
  expect_error([&] { w.add_tensor("u", static_cast<GgmlType>(9), {32}, four); }, "type 9 (q8_1) is not supported");
  GgufWriter q;
  const std::vector<uint8_t> block(34);
  q.add_tensor("q", GgmlType::q8_0, {32}, block);
  expect_error([&] { q.write(temp_path("noqv.gguf")); }, "no general.quantization_version");
  GgufWriter v;
  v.add("tokenizer.ggml.tokens", GgufValue::string_array(std::vector<std::string>{"a", "b"}));
  v.add("tokenizer.ggml.scores", array_of<float>({0.f}));
  expect_error([&] { v.write(temp_path("vocab.gguf")); }, "tokenizer.ggml.scores has 1 entries but");
}

TEST(GgufReader, AcceptsVersion2WhichHasVersion3sLayout) {
  Builder f;
  f.header(1, 1, 2).kv_str("general.architecture", "llama").tensor("w", {2}, kTF32, 0).pad(32).data(8);
  const GgufFile g = open_bytes(f.b);
  EXPECT_EQ(g.version(), 2u);
  EXPECT_EQ(g.tensor("w").n_elements, 2);
  EXPECT_EQ(g.tensor("w").bytes()[0], 1);
}

TEST(GgufReader, GettersNameTheKeyAndTheActualTypeOnAMismatch) {
  GgufWriter w;
  w.add("a.u32", GgufValue::u32(300));
  w.add("a.i8", GgufValue::i8(-1));
  w.add("a.u64", GgufValue::u64(1ull << 63));
  w.add("a.ints", array_of<int32_t>({1}));
  w.add("a.big", array_of<uint64_t>({1ull << 63}));
  const std::string path = temp_path("getters.gguf");
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  const std::string key = "GGUF file '" + path + "': key ";
  expect_error([&] { f.get_int<uint8_t>("a.u32"); },
               key + "'a.u32' = 300 (u32) is outside the range allowed here, [0, 255]");
  expect_error([&] { f.get_int<uint32_t>("a.i8"); }, "'a.i8' = -1 (i8) is outside");
  expect_error([&] { f.get_int<int64_t>("a.u64"); }, "'a.u64' = 9223372036854775808 (u64) is outside");
  expect_error([&] { f.get_string("a.u32"); }, key + "'a.u32' is u32, not a string");
  expect_error([&] { f.get_float("a.u32"); }, "is u32, not a float");
  expect_error([&] { f.get_bool("a.u32"); }, "is u32, not a bool");
  expect_error([&] { f.get_string_array("a.ints"); }, "'a.ints' is array of i32, not an array of string");
  expect_error([&] { f.get_float_array("a.ints"); }, "is array of i32, not an array of f32 or f64");
  expect_error([&] { f.get_int_array("a.u32"); }, "is u32, not an array of integers");
  expect_error([&] { f.get_int_array("a.big"); }, "'a.big'[0] = 9223372036854775808 (u64) is larger than 2^63-1");
  expect_error([&] { f.get_int<int>("nope"); }, "has no key 'nope'");
  expect_error([&] { f.tensor("nope"); }, "has no tensor 'nope'");
}

TEST(GgufReader, DescribeJsonListsKeysAndTensorsInFileOrder) {
  GgufWriter w;
  w.add("general.architecture", GgufValue::string("llama"));
  w.add("x.big", GgufValue::u64(18446744073709551615ull));
  w.add("x.nan", GgufValue::f32(std::nanf("")));
  w.add("x.list", array_of<float>({0.25f}));
  const std::vector<uint8_t> data(4);
  w.add_tensor("w", GgmlType::f32, {1}, data);
  const std::string path = temp_path("describe.gguf");
  w.write(path);
  const std::string json = gguf_describe_json(GgufFile::open(path));
  for (const char* part :
       {R"("version": 3)", R"("key": "x.big",)", R"("value": "18446744073709551615")", R"("value": "nan")",
        R"("element_type": "f32")", "0.25", R"("name": "w")", R"("dims": [)", R"("tensor_data_offset": ")"})
    EXPECT_NE(json.find(part), std::string::npos) << part << " not in " << json;
  EXPECT_LT(json.find("general.architecture"), json.find("x.big"));
}

}  // namespace
}  // namespace loom::io
