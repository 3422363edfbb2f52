// loom models through GGUF files (model/gguf_model.h): written, read back
// and compared with the parameters they came from; llama's Q/K permutation
// checked on the file's own bytes; quantized weights equal to the reference
// dequantization of their blocks.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "model/gguf_model.h"
#include "model/params.h"

namespace loom::model {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.n_kv_head = 4, c.d_ff = 256, c.vocab_size = 96, c.max_seq_len = 32;
  return c;
}

ModelConfig tiny_llama(int64_t n_expert = 0) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = 3, c.n_embd = 64, c.n_head = 8, c.n_kv_head = 2, c.d_ff = 96, c.vocab_size = 80, c.max_seq_len = 48;
  c.rope_theta = 500000.f, c.norm_eps = 1e-6f, c.tie_embeddings = false;
  c.n_expert = n_expert, c.top_k = 2, c.capacity_factor = 0.f;
  return c;
}

struct Params {
  std::vector<float> values;
  Tensor flat() { return Tensor(values.data(), DType::f32, {static_cast<int64_t>(values.size())}); }
};

Params random_params(const ModelConfig& cfg, uint64_t seed = 3) {
  Params p;
  p.values.resize(static_cast<size_t>(param_count(param_specs(cfg))));
  init_params(p.flat(), param_specs(cfg), seed);
  // Norm weights start at 1 and biases at 0: perturb them so a swap shows.
  for (size_t i = 0; i < p.values.size(); ++i) p.values[i] += 1e-3f * static_cast<float>(i % 7);
  return p;
}

std::string write(const ModelConfig& cfg, Params& p, GgufWeights w, const std::string& file) {
  const std::string path = (fs::temp_directory_path() / ("loom_test_gguf_model_" + file)).string();
  io::GgufWriter writer;
  gguf_add_model(writer, cfg, p.flat(), w, "test");
  writer.write(path);
  return path;
}

Params read_back(const std::string& path, ModelConfig* cfg_out = nullptr) {
  const io::GgufFile f = io::GgufFile::open(path);
  const ModelConfig cfg = model_config_from_gguf(f);
  Params p;
  p.values.resize(static_cast<size_t>(param_count(param_specs(cfg))));
  load_params_from_gguf(p.flat(), cfg, f);
  if (cfg_out) *cfg_out = cfg;
  return p;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  if (a.family == Family::llama) {
    EXPECT_EQ(a.rope_theta, b.rope_theta);
  }
  EXPECT_EQ(a.n_expert, b.n_expert);
  if (a.is_moe()) {
    EXPECT_EQ(a.top_k, b.top_k);
  }
}

TEST(GgufModel, F32RoundTripIsBitwiseForGpt2LlamaGqaAndMoe) {
  for (const ModelConfig& cfg : {tiny_gpt2(), tiny_llama(), tiny_llama(4)}) {
    Params p = random_params(cfg);
    ModelConfig back_cfg;
    const Params back = read_back(write(cfg, p, GgufWeights::f32, "f32.gguf"), &back_cfg);
    expect_same_config(cfg, back_cfg);
    ASSERT_EQ(back.values.size(), p.values.size());
    EXPECT_EQ(std::memcmp(back.values.data(), p.values.data(), p.values.size() * 4), 0) << family_name(cfg.family);
  }
}

TEST(GgufModel, SixteenBitWeightsRoundEachValueOnceAndKeepVectorsF32) {
  for (GgufWeights w : {GgufWeights::f16, GgufWeights::bf16}) {
    const ModelConfig cfg = tiny_llama();
    Params p = random_params(cfg);
    const Params back = read_back(write(cfg, p, w, "half.gguf"));
    for (const ParamSpec& s : param_specs(cfg)) {
      for (int64_t i = 0; i < s.numel(); ++i) {
        const float x = p.values[s.offset + i], got = back.values[s.offset + i];
        const float want = s.shape.ndim() == 1 ? x : (w == GgufWeights::f16 ? from_f16(to_f16(x)) : from_bf16(to_bf16(x)));
        ASSERT_EQ(got, want) << s.name << "[" << i << "] " << gguf_weights_name(w);
      }
    }
  }
}

// llama.cpp's llama pairs neighbours in RoPE: GGUF row h*HS + 2i + half is
// loom's row h*HS + half*HS/2 + i (q with NH heads, k with NKV).
TEST(GgufModel, LlamaQueryAndKeyRowsArePermutedAsLlamaCppsConverterDoes) {
  const ModelConfig cfg = tiny_llama();
  Params p = random_params(cfg);
  const io::GgufFile f = io::GgufFile::open(write(cfg, p, GgufWeights::f32, "perm.gguf"));
  const int64_t HS = cfg.head_size(), C = cfg.n_embd;
  for (const char* proj : {"q_proj", "k_proj"}) {
    const ParamSpec* spec = nullptr;
    const std::vector<ParamSpec> specs = param_specs(cfg);
    for (const ParamSpec& s : specs)
      if (s.name == concat("model.layers.1.self_attn.", proj, ".weight")) spec = &s;
    ASSERT_NE(spec, nullptr);
    const io::GgufTensorInfo& t = f.tensor(std::string("blk.1.attn_") + proj[0] + ".weight");
    const float* g = reinterpret_cast<const float*>(t.data);
    for (int64_t r = 0; r < spec->shape[0]; ++r) {
      const int64_t h = r / HS, j = r % HS, from = h * HS + (j % 2) * (HS / 2) + j / 2;
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(g[r * C + c], p.values[spec->offset + from * C + c]) << proj << " row " << r;
    }
  }
}

TEST(GgufModel, QuantizedWeightsReadBackAsTheirBlocksDequantized) {
  const ModelConfig cfg = tiny_gpt2();
  for (GgufWeights w : {GgufWeights::q8_0, GgufWeights::q4_0}) {
    Params p = random_params(cfg);
    const Params back = read_back(write(cfg, p, w, "quant.gguf"));
    const kernels::QuantType q = w == GgufWeights::q8_0 ? kernels::QuantType::q8_0 : kernels::QuantType::q4_0;
    for (const ParamSpec& s : param_specs(cfg)) {
      if (s.shape.ndim() == 1) {
        for (int64_t i = 0; i < s.numel(); ++i) ASSERT_EQ(back.values[s.offset + i], p.values[s.offset + i]) << s.name;
        continue;
      }
      if (s.name == "wpe.weight") continue;  // f16 in quantized files
      const int64_t ne0 = s.shape[1];
      std::vector<uint8_t> blocks(kernels::quant_row_bytes(q, ne0));
      std::vector<float> want(static_cast<size_t>(ne0));
      for (int64_t r = 0; r < s.shape[0]; ++r) {
        kernels::quantize_row(q, &p.values[s.offset + r * ne0], blocks.data(), ne0);
        kernels::dequantize_row(q, blocks.data(), want.data(), ne0);
        for (int64_t c = 0; c < ne0; ++c) ASSERT_EQ(back.values[s.offset + r * ne0 + c], want[c]) << s.name << " row " << r;
      }
    }
  }
}

TEST(GgufModel, Q4KMStoresTheOutputAndChosenLayersInQ6K) {
  ModelConfig cfg = tiny_llama();
  cfg.n_layer = 8, cfg.n_embd = 256, cfg.n_head = 4, cfg.n_kv_head = 2, cfg.d_ff = 512;
  Params p = random_params(cfg);
  const io::GgufFile f = io::GgufFile::open(write(cfg, p, GgufWeights::q4_K_M, "q4km.gguf"));
  EXPECT_EQ(f.tensor("output.weight").type, io::GgmlType::q6_K);
  EXPECT_EQ(f.tensor("blk.3.attn_q.weight").type, io::GgmlType::q4_K);
  // use_more_bits(i, 8): layers 0 and 7 (the eighths) and 3, 6 ((i - 1) % 3 == 2).
  for (int i = 0; i < 8; ++i) {
    const bool more = i == 0 || i == 7 || (i - 1) % 3 == 2;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".ffn_down.weight")).type, more ? io::GgmlType::q6_K : io::GgmlType::q4_K) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_v.weight")).type, more ? io::GgmlType::q6_K : io::GgmlType::q4_K) << i;
  }
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, io::GgmlType::f32);
  EXPECT_EQ(f.get_int<uint32_t>("general.file_type"), 15u);
  EXPECT_EQ(f.get_int<uint32_t>("general.quantization_version"), 2u);
  ModelConfig back_cfg;
  read_back(f.path(), &back_cfg);
  expect_same_config(cfg, back_cfg);
}

// llama.cpp's Q4_K_M for an 8-expert model (Mixtral): attn_k and attn_v in q8_0, attn_output in q5_K; the
// experts' ffn_down_exps follow use_more_bits. GPT-2's fused attn_qkv takes attn_v's rule (q6_K in the layers
// use_more_bits picks), as the llama.cpp release tests/interop pins does; its tied token_embd q6_K (the output).
TEST(GgufModel, Q4KMFollowsLlamaCppsMixForEightExpertsAndGpt2) {
  ModelConfig cfg = tiny_llama();
  cfg.n_layer = 8, cfg.n_embd = 256, cfg.n_head = 4, cfg.n_kv_head = 2, cfg.d_ff = 256;
  cfg.n_expert = 8, cfg.top_k = 2, cfg.capacity_factor = 0.f;
  Params p = random_params(cfg);
  const io::GgufFile f = io::GgufFile::open(write(cfg, p, GgufWeights::q4_K_M, "q4km_moe.gguf"));
  for (int i = 0; i < 8; ++i) {
    const bool more = i == 0 || i == 7 || (i - 1) % 3 == 2;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_k.weight")).type, io::GgmlType::q8_0) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_v.weight")).type, io::GgmlType::q8_0) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_output.weight")).type, io::GgmlType::q5_K) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_q.weight")).type, io::GgmlType::q4_K) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".ffn_down_exps.weight")).type, more ? io::GgmlType::q6_K : io::GgmlType::q4_K)
        << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".ffn_up_exps.weight")).type, io::GgmlType::q4_K) << i;
  }
  ModelConfig gpt2 = tiny_gpt2();
  gpt2.n_embd = 256, gpt2.d_ff = 1024;
  Params q = random_params(gpt2);
  const io::GgufFile g = io::GgufFile::open(write(gpt2, q, GgufWeights::q4_K_M, "q4km_gpt2.gguf"));
  // use_more_bits(i, 2): layer 1 only (i >= 7 * 2 / 8).
  EXPECT_EQ(g.tensor("blk.0.attn_qkv.weight").type, io::GgmlType::q4_K);
  EXPECT_EQ(g.tensor("blk.1.attn_qkv.weight").type, io::GgmlType::q6_K);
  EXPECT_EQ(g.tensor("token_embd.weight").type, io::GgmlType::q6_K);
}

// Q5_K_M: q5_K, q6_K where Q4_K_M takes it; general.file_type 17.
TEST(GgufModel, Q5KMFollowsLlamaCppsMix) {
  ModelConfig cfg = tiny_llama();
  cfg.n_layer = 8, cfg.n_embd = 256, cfg.n_head = 4, cfg.n_kv_head = 2, cfg.d_ff = 512;
  Params p = random_params(cfg);
  const io::GgufFile f = io::GgufFile::open(write(cfg, p, GgufWeights::q5_K_M, "q5km.gguf"));
  EXPECT_EQ(f.tensor("output.weight").type, io::GgmlType::q6_K);
  EXPECT_EQ(f.tensor("token_embd.weight").type, io::GgmlType::q5_K);
  for (int i = 0; i < 8; ++i) {
    const bool more = i == 0 || i == 7 || (i - 1) % 3 == 2;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".ffn_down.weight")).type, more ? io::GgmlType::q6_K : io::GgmlType::q5_K) << i;
    EXPECT_EQ(f.tensor(concat("blk.", i, ".attn_q.weight")).type, io::GgmlType::q5_K) << i;
  }
  EXPECT_EQ(f.get_int<uint32_t>("general.file_type"), 17u);
  ModelConfig gpt2 = tiny_gpt2();
  gpt2.n_embd = 256, gpt2.d_ff = 1024;
  Params q = random_params(gpt2);
  const io::GgufFile g = io::GgufFile::open(write(gpt2, q, GgufWeights::q5_K_M, "q5km_gpt2.gguf"));
  EXPECT_EQ(g.tensor("blk.0.attn_qkv.weight").type, io::GgmlType::q5_K);
  EXPECT_EQ(g.tensor("blk.1.attn_qkv.weight").type, io::GgmlType::q6_K);
}

// llama-quantize's fallbacks: q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0.
TEST(GgufModel, RowsThatNoBlockDividesFallBackAsLlamaQuantizes) {
  ModelConfig cfg = tiny_gpt2();  // rows of 64 and 256: q4_K's 256 divides only the latter
  Params p = random_params(cfg);
  for (const auto& [w, fallback] : {std::pair{GgufWeights::q5_K, io::GgmlType::q5_1},
                                    std::pair{GgufWeights::q6_K, io::GgmlType::q8_0}})
    EXPECT_EQ(io::GgufFile::open(write(cfg, p, w, "fallback_k.gguf")).tensor("blk.0.attn_qkv.weight").type, fallback);
  ::testing::internal::CaptureStderr();
  const io::GgufFile f = io::GgufFile::open(write(cfg, p, GgufWeights::q4_K, "fallback.gguf"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(f.tensor("blk.0.attn_qkv.weight").type, io::GgmlType::q5_0);   // rows of C = 64
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, io::GgmlType::q4_K);   // rows of F = 256
  // And it says so, as llama-quantize does.
  EXPECT_NE(log.find("weight matrices are stored in another type than asked"), std::string::npos) << log;
  EXPECT_NE(log.find("blk.0.attn_qkv.weight q4_K -> q5_0 (64 values a row)"), std::string::npos) << log;
}

TEST(GgufModel, AnArchitectureLoomDoesNotRunIsAClearError) {
  io::GgufWriter w;
  w.add("general.architecture", io::GgufValue::string("mamba"));
  const std::string path = (fs::temp_directory_path() / "loom_test_gguf_model_mamba.gguf").string();
  w.write(path);
  try {
    model_config_from_gguf(io::GgufFile::open(path));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture is 'mamba'; loom runs gpt2 and llama"), std::string::npos)
        << e.what();
  }
}

// A tensor loom would not read changes the model: refused by name (the
// model's own tensors still load).
TEST(GgufModel, ATensorLoomWouldNotReadIsRefusedByName) {
  const ModelConfig cfg = tiny_llama();
  Params p = random_params(cfg);
  const std::vector<float> ones(cfg.head_size() / 2, 1.f), bias(cfg.n_embd, 0.5f);
  const auto bytes = [](const std::vector<float>& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
  };
  for (const auto& [name, values, expect] :
       {std::tuple{"rope_freqs.weight", &ones, "Llama 3.1-style RoPE frequency factors"},
        std::tuple{"blk.0.attn_q.bias", &bias, "a bias this model family has no place for"},
        std::tuple{"blk.3.attn_norm.weight", &bias, "a tensor of no block of the 3 the keys describe"}}) {
    const std::string path = (fs::temp_directory_path() / "loom_test_gguf_model_extra.gguf").string();
    io::GgufWriter w;
    gguf_add_model(w, cfg, p.flat(), GgufWeights::f32, "test");
    w.add_tensor(name, io::GgmlType::f32, {static_cast<int64_t>(values->size())}, bytes(*values));
    w.write(path);
    try {
      read_back(path);
      ADD_FAILURE() << name << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(concat("tensor '", name, "' is ", expect)), std::string::npos) << e.what();
    }
  }
}

TEST(GgufModel, MoeOtherThanMixtralsIsRefusedWithTheKeysThatDiffer) {
  ModelConfig cfg = tiny_llama(4);
  cfg.n_shared_expert = 1;
  Params p = random_params(cfg);
  io::GgufWriter w;
  try {
    gguf_add_model(w, cfg, p.flat(), GgufWeights::f32, "x");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_shared_expert = 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::model
