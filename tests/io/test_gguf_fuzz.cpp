// GGUF reader under a seeded mutator: 2000 mutations of a valid file (bit
// flips, random bytes, truncations, inserted and deleted bytes, length and
// type fields set to extreme values), each of which must either open — and
// then every value and every tensor byte be readable — or throw loom::Error.
// Anything else (a crash, an InternalError, a std:: exception) fails; the
// sanitizer build runs this under AddressSanitizer.
#include <random>

#include "io/gguf_test_util.h"

namespace loom::io {
namespace {

using namespace gguf_test;

Bytes seed_file() {
  GgufWriter w;
  w.add("general.architecture", GgufValue::string("llama"));
  w.add("general.quantization_version", GgufValue::u32(2));
  w.add("llama.block_count", GgufValue::u32(2));
  w.add("llama.rope.freq_base", GgufValue::f32(10000.f));
  w.add("x.flag", GgufValue::boolean(true));
  w.add("x.big", GgufValue::i64(-5));
  const std::vector<std::string> tokens{"<s>", "</s>", "\xe2\x96\x81the", "a", "<0x0A>"};
  w.add("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  const std::vector<float> scores{0.f, -1.f, -2.f, -3.f, -4.f};
  w.add("tokenizer.ggml.scores", GgufValue::array<float>(scores));
  const std::vector<int32_t> types{3, 3, 1, 1, 6};
  w.add("tokenizer.ggml.token_type", GgufValue::array<int32_t>(types));
  const std::vector<GgufValue> inner{GgufValue::array<int32_t>(types), GgufValue::bool_array({true, false})};
  w.add("x.nested", GgufValue::array_of_arrays(inner));
  static const std::vector<uint8_t> f32(4 * 8 * 2, 1), q8(34 * 2, 2), q4k(144, 3);
  w.add_tensor("token_embd.weight", GgmlType::f32, {8, 2}, f32);
  w.add_tensor("blk.0.attn_q.weight", GgmlType::q8_0, {32, 2}, q8);
  w.add_tensor("output.weight", GgmlType::q4_K, {256}, q4k);
  const std::string path = temp_path("fuzz_seed.gguf");
  w.write(path);
  return read_bytes(path);
}

// Reads everything an accepted file offers, so that an unchecked length
// shows up as a sanitizer report or a wrong value, not silently.
uint64_t touch_everything(const GgufFile& f) {
  uint64_t sum = gguf_describe_json(f).size();
  for (const GgufKv& kv : f.kvs()) {
    const GgufValue& v = kv.value;
    try {
      if (v.type() == GgufValueType::string) sum += v.as_string("v").size();
      if (v.is_array() && v.element_type() == GgufValueType::string) sum += v.as_string_array("v").size();
      if (v.is_array() && v.element_type() == GgufValueType::array) sum += v.as_array_of_arrays("v").size();
      if (v.is_array() && v.element_type() == GgufValueType::i32) sum += v.as_int_array("v").size();
      if (v.is_array() && v.element_type() == GgufValueType::f32) sum += v.as_float_array("v").size();
      sum += static_cast<uint64_t>(v.as_int<int64_t>("v"));
    } catch (const Error&) {
      // A type or range mismatch of the probing calls above.
    }
  }
  for (const GgufTensorInfo& t : f.tensors())
    for (uint8_t b : t.bytes()) sum += b;
  return sum;
}

void mutate(Bytes& b, std::mt19937_64& rng, uint64_t header_end) {
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  // Most structure is in the header: aim 3 of 4 mutations there.
  auto position = [&] { return pick(4) != 0 ? pick(std::min<uint64_t>(header_end, b.size())) : pick(b.size()); };
  static constexpr uint64_t kExtreme[] = {0, 1, 7, 12, 13, 31, 0x80, 0xffff, 1ull << 32, 1ull << 62, 1ull << 63,
                                          ~0ull, ~0ull - 7};
  const uint64_t kind = pick(7);
  if (b.empty()) return;
  if (kind == 0) {
    for (uint64_t i = 0, n = 1 + pick(8); i < n; ++i) b[position()] ^= static_cast<uint8_t>(1u << pick(8));
  } else if (kind == 1) {
    b[position()] = static_cast<uint8_t>(rng());
  } else if (kind == 2) {
    b.resize(pick(b.size()));
  } else if (kind == 3 || kind == 4) {
    const uint64_t at = position();
    const uint64_t v = kExtreme[pick(std::size(kExtreme))];
    const size_t width = kind == 3 ? 8 : 4;
    for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  } else if (kind == 5) {
    b.insert(b.begin() + static_cast<std::ptrdiff_t>(position()), 1 + pick(16), static_cast<uint8_t>(rng()));
  } else {
    const uint64_t at = position();
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
            b.begin() + static_cast<std::ptrdiff_t>(std::min<uint64_t>(b.size(), at + 1 + pick(16))));
  }
}

TEST(GgufFuzz, TwoThousandMutationsEitherOpenCleanlyOrThrowLoomError) {
  const Bytes seed = seed_file();
  const uint64_t header_end = open_bytes(seed, "fuzz_check.gguf").data_offset();
  std::mt19937_64 rng(20240535);
  const std::string path = temp_path("fuzz.gguf");
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes b = seed;
    for (uint64_t m = 0, n = 1 + rng() % 3; m < n; ++m) mutate(b, rng, header_end);
    write_bytes(path, b);
    try {
      const GgufFile f = GgufFile::open(path);
      touch_everything(f);
      ++accepted;
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << "iteration " << iter << ": " << e.what();
    }
  }
  // Both outcomes must occur, or the mutator is not exercising the reader.
  EXPECT_GT(accepted, 50);
  EXPECT_GT(rejected, 500);
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
}

}  // namespace
}  // namespace loom::io
