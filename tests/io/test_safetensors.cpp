// safetensors: round trips, the reference layout (a file written by hand from
// the spec in tests/ref/ref_safetensors.py), and one test per rejection rule.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/ref.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_index.h"

namespace loom::io {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / concat("loom_test_safetensors_", ::getpid());
  fs::create_directories(dir);
  return (dir / name).string();
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// u64 header length n (default: header.size()), header, then data bytes.
Bytes craft(const std::string& header, size_t data_bytes, int64_t n = -1) {
  const uint64_t len = n < 0 ? header.size() : static_cast<uint64_t>(n);
  Bytes b;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<unsigned char>(len >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<unsigned char>(i));
  return b;
}

// Opening `bytes` must throw a loom::Error naming the file and `problem`.
void expect_rejected(const Bytes& bytes, const std::string& problem) {
  const std::string path = temp_path("bad.safetensors");
  write_file(path, bytes);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "accepted a file that should fail with: " << problem;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << "message: " << msg << "\nexpected: " << problem;
  }
}

void expect_header_rejected(const std::string& header, size_t data_bytes, const std::string& problem) {
  expect_rejected(craft(header, data_bytes), problem);
}

template <typename T>
std::vector<T> iota_values(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(i * 3 + 1);
  return v;
}

TEST(Safetensors, RoundTripsAllSixDtypesScalarsEmptyTensorsAndMetadata) {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  std::vector<bf16> b16 = {to_bf16(1.0f), to_bf16(-3.5f), to_bf16(1e30f), to_bf16(-0.0f)};
  std::vector<f16> h16 = {to_f16(0.5f), to_f16(-65504.0f), to_f16(6e-8f)};
  std::vector<int32_t> i32 = {INT32_MIN, -1, 0, INT32_MAX};
  std::vector<int64_t> i64 = {INT64_MIN, -5, 9, INT64_MAX, 1, 2};
  std::vector<uint8_t> u8 = iota_values<uint8_t>(12);
  float scalar = 42.0f;
  const std::vector<std::pair<std::string, Tensor>> in = {
      {"w.f32", Tensor(f32.data(), DType::f32, {2, 3})},
      {"w.bf16", Tensor(b16.data(), DType::bf16, {2, 2})},
      {"w.f16", Tensor(h16.data(), DType::f16, {3})},
      {"ids.i32", Tensor(i32.data(), DType::i32, {1, 4})},
      {"ids.i64", Tensor(i64.data(), DType::i64, {3, 1, 2})},
      {"bytes.u8", Tensor(u8.data(), DType::u8, {2, 2, 3})},
      {"scalar", Tensor(&scalar, DType::f32, Shape{})},
      {"empty", Tensor(nullptr, DType::bf16, {0, 5})},
  };
  const std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(path, in, {{"format", "pt"}, {"step", "12"}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.tensors().size(), in.size());
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  for (const auto& [name, t] : in) {
    const TensorInfo& info = file.info(name);
    EXPECT_EQ(info.dtype, t.dtype()) << name;
    EXPECT_EQ(info.shape, t.shape()) << name;
    std::vector<unsigned char> back(t.nbytes() + 1, 0xAB);
    file.read(name, Tensor(back.data(), t.dtype(), t.shape()));
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(back.data(), t.data(), t.nbytes()), 0) << name;
    }
    EXPECT_EQ(back[t.nbytes()], 0xAB) << name << ": wrote past the destination";
  }
}

TEST(Safetensors, WriterOrdersByDtypeThenNameAndPadsHeaderToEightBytes) {
  std::vector<uint8_t> u8 = {1};
  std::vector<float> f32 = {1, 2};
  std::vector<int64_t> i64 = {3};
  const std::string path = temp_path("order.safetensors");
  write_safetensors(path, {{"b", Tensor(u8.data(), DType::u8, {1})},
                           {"z", Tensor(f32.data(), DType::f32, {2})},
                           {"a", Tensor(f32.data(), DType::f32, {2})},
                           {"c", Tensor(i64.data(), DType::i64, {1})}});
  const Bytes bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  EXPECT_EQ(n % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            "{\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
            "\"z\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
            "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[24,25]}}");
  EXPECT_EQ(bytes.size(), 8 + n + 25);
}

TEST(Safetensors, ReadsTheFileWrittenFromTheSpecInPython) {
  const std::string path = std::string(LOOM_REF_DIR) + "/safetensors_hand.safetensors";
  test::RefCase ref("safetensors_hand.ref");
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "written by ref_safetensors.py");
  std::vector<std::pair<std::string, Tensor>> all;
  for (const auto& [name, info] : file.tensors()) {
    ASSERT_TRUE(ref.has(name)) << name;
    test::RefTensor& want = ref[name];
    EXPECT_EQ(info.dtype, want.dtype) << name;
    EXPECT_EQ(info.shape, want.shape) << name;
    std::vector<unsigned char> got(want.bytes.size());
    file.read(name, Tensor(got.data(), want.dtype, want.shape));
    EXPECT_EQ(got, want.bytes) << name;
    all.emplace_back(name, want.view());
  }
  EXPECT_EQ(all.size(), 9u);
  // Our writer, given the same tensors, produces the same bytes as the
  // reference layout.
  const std::string ours = temp_path("ours.safetensors");
  write_safetensors(ours, all, file.metadata());
  EXPECT_EQ(read_file(ours), read_file(path));
}

TEST(Safetensors, WriterRejectsDuplicateNamesNonContiguousTensorsAndTheReservedName) {
  std::vector<float> v(6, 1.0f);
  const Tensor t(v.data(), DType::f32, {2, 3});
  const std::string path = temp_path("bad_write.safetensors");
  EXPECT_THROW(write_safetensors(path, {{"x", t}, {"x", t}}), Error);
  try {
    write_safetensors(path, {{"x", t}, {"x", t}});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x' appears twice"), std::string::npos) << e.what();
  }
  try {
    write_safetensors(path, {{"col", t.slice(1, 1, 1)}});
    ADD_FAILURE() << "wrote a non-contiguous tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not contiguous"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Safetensors, WriterReplacesAnExistingFileAtomically) {
  std::vector<float> a = {1}, b = {2, 3};
  const std::string path = temp_path("replace.safetensors");
  write_safetensors(path, {{"x", Tensor(a.data(), DType::f32, {1})}});
  write_safetensors(path, {{"x", Tensor(b.data(), DType::f32, {2})}});
  EXPECT_EQ(SafetensorsFile::open(path).info("x").shape, Shape({2}));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// ---- reader rejections: one rule each --------------------------------------

const std::string kF32x2 = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsReject, FileShorterThanEightBytes) {
  expect_rejected(Bytes{1, 2, 3}, "shorter than the 8-byte header length");
}

TEST(SafetensorsReject, HeaderLengthAboveTheLimit) {
  expect_rejected(craft(kF32x2, 8, 100'000'001), "exceeds the limit of 100000000 bytes");
  expect_rejected(craft(kF32x2, 8, INT64_MAX), "exceeds the limit");
}

TEST(SafetensorsReject, HeaderLengthPastTheEndOfFile) {
  expect_rejected(craft(kF32x2, 0, 1000), "runs past the end of the file");
}

TEST(SafetensorsReject, HeaderNotJson) {
  expect_header_rejected(R"({"x": {"dtype": "F32", )", 0, "header is not valid JSON");
  expect_header_rejected("{\"x\xff\":1}", 0, "header is not valid JSON");  // invalid UTF-8
}

TEST(SafetensorsReject, HeaderNotAnObject) {
  expect_header_rejected("[1, 2]", 0, "header must be a JSON object");
  expect_header_rejected("{} {}", 0, "header is not valid JSON");
}

TEST(SafetensorsReject, EntryMissingDtypeShapeOrOffsets) {
  expect_header_rejected(R"({"x":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 'x' has no dtype");
  expect_header_rejected(R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 'x' has no shape");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[2]}})", 8, "tensor 'x' has no data_offsets");
  expect_header_rejected(R"({"x":[1]})", 8, "tensor 'x' must be an object");
}

TEST(SafetensorsReject, EntryFieldsOfTheWrongType) {
  expect_header_rejected(R"({"x":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8, "dtype must be a string");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8, "shape must be an array");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8,
                         "shape entries must be non-negative integers");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8,
                         "data_offsets must be [begin, end]");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", 8,
                         "data_offsets entries must be non-negative integers");
  expect_header_rejected(R"({"__metadata__":{"k":1},)" + kF32x2.substr(1), 8,
                         "__metadata__ value of 'k' must be a string");
  expect_header_rejected(R"({"__metadata__":[],)" + kF32x2.substr(1), 8, "__metadata__ must be an object");
}

TEST(SafetensorsReject, UnknownDtypeListsTheSupportedOnes) {
  expect_header_rejected(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
                         "tensor 'x': unsupported dtype 'F64': supported are F32, BF16, F16, I32, I64, U8");
}

TEST(SafetensorsReject, NegativeShape) {
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
                         "shape entries must be non-negative integers, got -2");
}

TEST(SafetensorsReject, OverflowingShape) {
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
                         "overflows");
  // numel fits in int64 but numel * 4 bytes does not.
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
                         "overflows");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8,
                         "overflows");
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[1,1,1,1,1,2],"data_offsets":[0,8]}})", 8,
                         "has more than 5 dims");
}

TEST(SafetensorsReject, OffsetsEndBeforeBegin) {
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
                         "data_offsets end 0 < begin 8");
}

TEST(SafetensorsReject, OffsetsEndPastTheBuffer) {
  expect_header_rejected(kF32x2, 4, "data_offsets end 8 is past the end of the data buffer (4 bytes)");
}

TEST(SafetensorsReject, SizeNotNumelTimesDtypeSize) {
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                         "F32 shape (3,) needs 12 bytes but data_offsets [0, 8] hold 8");
}

TEST(SafetensorsReject, OverlappingTensors) {
  expect_header_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12, "tensor 'b' [4, 12) overlaps tensor 'a'");
}

TEST(SafetensorsReject, GapBetweenTensors) {
  expect_header_rejected(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         12, "gap of 4 unused bytes before tensor 'b' at offset 4");
  expect_header_rejected(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
                         "gap of 4 unused bytes before tensor 'b' at offset 0");
}

TEST(SafetensorsReject, UnusedBytesAfterTheLastTensor) {
  expect_header_rejected(kF32x2, 11, "3 unused bytes after the last tensor");
  expect_header_rejected("{}", 1, "1 unused bytes after the last tensor");
}

TEST(SafetensorsReject, DuplicateNames) {
  expect_header_rejected(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         8, "duplicate key 'x' in the header");
  expect_header_rejected(R"({"x":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8,
                         "duplicate key 'dtype'");
}

TEST(SafetensorsReject, NotARegularFileOrMissing) {
  for (const std::string& path : {temp_path(""), temp_path("does_not_exist.safetensors")}) {
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST(Safetensors, AcceptsAnEmptyHeaderObjectWithTrailingPadding) {
  const std::string path = temp_path("empty.safetensors");
  write_file(path, craft("{}      ", 0));
  EXPECT_TRUE(SafetensorsFile::open(path).tensors().empty());
}

// ---- read() misuse -----------------------------------------------------------

class SafetensorsRead : public ::testing::Test {
 protected:
  void SetUp() override {
    path = temp_path("read.safetensors");
    write_safetensors(path, {{"alpha", Tensor(v.data(), DType::f32, {2, 3})},
                             {"beta", Tensor(v.data(), DType::f32, {6})}});
  }
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  std::string path;
};

TEST_F(SafetensorsRead, UnknownNameListsTheNamesThere) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> dst(6);
  try {
    f.read("gamma", Tensor(dst.data(), DType::f32, {6}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'gamma'; it has 'alpha', 'beta'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsRead, DtypeOrShapeMismatchNamesBoth) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> dst(6);
  try {
    f.read("alpha", Tensor(dst.data(), DType::f32, {3, 2}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'alpha' is f32(2, 3) but the destination is f32(3, 2)"), std::string::npos)
        << e.what();
  }
  try {
    f.read("beta", Tensor(dst.data(), DType::i32, {6}));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'beta' is f32(6,) but the destination is i32(6,)"), std::string::npos)
        << e.what();
  }
}

TEST_F(SafetensorsRead, NonContiguousDestinationIsAnError) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> dst(12);
  const Tensor wide(dst.data(), DType::f32, {2, 6});
  EXPECT_THROW(f.read("alpha", wide.slice(1, 0, 3)), Error);
}

TEST_F(SafetensorsRead, FileTruncatedAfterOpenIsAnErrorNotACrash) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  fs::resize_file(path, fs::file_size(path) - 10);
  std::vector<float> dst(6);
  EXPECT_THROW(f.read("beta", Tensor(dst.data(), DType::f32, {6})), Error);
}

// ---- robustness ----------------------------------------------------------------

// Random byte mutations of a valid file: every open and read either succeeds
// or throws loom::Error; anything else (another exception, a crash) fails.
TEST(Safetensors, RandomMutationsNeverCrash) {
  std::vector<float> f32 = {1, 2, 3, 4};
  std::vector<bf16> b16 = {to_bf16(1), to_bf16(2)};
  std::vector<int64_t> i64 = {7};
  const std::string good = temp_path("good.safetensors");
  write_safetensors(good, {{"a", Tensor(f32.data(), DType::f32, {2, 2})},
                           {"b", Tensor(b16.data(), DType::bf16, {2})},
                           {"c", Tensor(i64.data(), DType::i64, Shape{})}},
                    {{"k", "v"}});
  const Bytes original = read_file(good);
  const std::string path = temp_path("mutant.safetensors");
  std::mt19937_64 rng(12345);
  int opened = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Bytes b = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[at] = static_cast<unsigned char>(rng()); break;
        case 1: b[at] = static_cast<unsigned char>("0123456789{}[],:\"-"[rng() % 18]); break;
        case 2: b.resize(at); break;
        default: b.insert(b.begin() + static_cast<int64_t>(at), static_cast<unsigned char>(rng())); break;
      }
      if (b.empty()) break;
    }
    write_file(path, b);
    try {
      const SafetensorsFile f = SafetensorsFile::open(path);
      ++opened;
      for (const auto& [name, info] : f.tensors()) {
        std::vector<unsigned char> dst(info.nbytes() + 1);
        f.read(name, Tensor(dst.data(), info.dtype, info.shape));
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(opened, 0);  // some mutations only touch tensor data
}

// A sharded checkpoint in a fresh directory: shard k holds the tensors
// `shards[k]` names (one f32 each), and the index maps `weight_map`.
std::string write_shards(const std::string& name, const std::vector<std::vector<std::string>>& shards,
                         const std::string& weight_map) {
  const fs::path dir = temp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<float> values(16, 1.f);
  for (size_t k = 0; k < shards.size(); ++k) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& t : shards[k]) tensors.emplace_back(t, Tensor(values.data(), DType::f32, {1}));
    write_safetensors((dir / concat("s", k + 1, ".safetensors")).string(), tensors);
  }
  std::ofstream((dir / kSafetensorsIndexFile).string()) << R"({"metadata": {}, "weight_map": )" << weight_map << "}";
  return (dir / kSafetensorsIndexFile).string();
}

void expect_shards_rejected(const std::string& index, const std::vector<std::string>& parts) {
  try {
    SafetensorsShards::open(index);
    ADD_FAILURE() << "accepted " << index;
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(SafetensorsShards, EachTensorIsFoundInTheShardTheIndexNames) {
  const std::string index = write_shards("ok", {{"a", "b"}, {"c"}},
                                         R"({"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"})");
  const SafetensorsShards s = SafetensorsShards::open(index);
  ASSERT_NE(s.find("c"), nullptr);
  EXPECT_NE(s.find("c")->path().find("s2.safetensors"), std::string::npos);
  EXPECT_NE(s.find("a")->path().find("s1.safetensors"), std::string::npos);
  EXPECT_EQ(s.find("d"), nullptr);
}

TEST(SafetensorsShards, AmbiguousOrIncompleteShardsAreErrorsNamingTheIndexAndTensor) {
  expect_shards_rejected(write_shards("missing", {{"a"}}, R"({"a": "s1.safetensors", "b": "s2.safetensors"})"),
                         {"model.safetensors.index.json: shard 's2.safetensors' (of tensor 'b') is missing"});
  expect_shards_rejected(write_shards("twice", {{"a"}, {"a", "b"}},
                                      R"({"a": "s1.safetensors", "b": "s2.safetensors"})"),
                         {"tensor 'a' is in two shards", "s1.safetensors' (as the weight_map says)", "s2.safetensors"});
  expect_shards_rejected(write_shards("elsewhere", {{"a"}, {"b"}},
                                      R"({"a": "s2.safetensors", "b": "s2.safetensors"})"),
                         {"weight_map puts tensor 'a' in shard 's2.safetensors', which does not hold it"});
  expect_shards_rejected(write_shards("unlisted", {{"a", "b"}}, R"({"a": "s1.safetensors"})"),
                         {"tensor 'b' of shard", "is not in the weight_map"});
  expect_shards_rejected(write_shards("path", {{"a"}}, R"({"a": "../s1.safetensors"})"),
                         {"weight_map['a'] = '../s1.safetensors' is not a file name"});
  expect_shards_rejected(write_shards("nomap", {{"a"}}, R"([])"), {"key 'weight_map' is missing or not an object"});
}

}  // namespace
}  // namespace loom::io
