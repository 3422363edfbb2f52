// Model config JSON (loom's and Hugging Face's) and model directories:
// export -> import round trips, HF key names, and errors naming file and key.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "common/compare.h"
#include "common/tensors.h"
#include "core/memory.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/model.h"

namespace loom::model {
namespace {

namespace fs = std::filesystem;
using loom::test::expect_error;
using loom::test::to_floats;
using nlohmann::json;

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(model_config_to_json(a), model_config_to_json(b));
}

class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_model_dir_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& p) const { return (dir_ / p).string(); }
  void write(const std::string& p, const std::string& text) {
    fs::create_directories(fs::path(path(p)).parent_path());
    std::ofstream(path(p)) << text;
  }
  fs::path dir_;
};

// Saves a fresh model of `preset` into dir.
void save_preset(const std::string& dir, const char* preset, uint64_t seed, ParamLayout layout) {
  const ModelConfig cfg = model_preset(preset);
  Pools pools;
  Model m(cfg, 1, 1, pools);
  m.init_params(seed);
  save_model_dir(dir, cfg, m.params(), layout);
}

TEST(ModelConfigJson, LoomKeysRoundTrip) {
  for (const std::string& name : model_preset_names()) {
    const ModelConfig c = model_preset(name);
    expect_same_config(model_config_from_json(model_config_to_json(c), "x"), c);
  }
}

TEST(ModelConfigJson, PresetThenExplicitKeys) {
  const ModelConfig c = model_config_from_json(json{{"preset", "llama-tiny"}, {"n_layer", 3}}, "cfg");
  EXPECT_EQ(c.family, Family::llama);
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.n_kv_head, model_preset("llama-tiny").n_kv_head);
}

// init-model --preset gpt2-tiny --set n_head=2 reads its keys this way.
TEST(ModelConfigJson, Gpt2PresetWithOtherHeadCountKeepsKvHeadsEqual) {
  const ModelConfig c = model_config_from_json(json{{"preset", "gpt2-tiny"}, {"n_head", 2}}, "init-model");
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.n_kv_head, 2);
  expect_error([] { model_config_from_json(json{{"preset", "gpt2-tiny"}, {"n_head", 2}, {"n_kv_head", 1}}, "x"); },
               {"x: ", "model.n_kv_head = 1", "family gpt2"});
}

TEST(ModelConfigJson, HfGpt2KeysAndRoundTrip) {
  const ModelConfig c = model_preset("gpt2-tiny");
  const json j = hf_config_to_json(c);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_layer"], c.n_layer);
  EXPECT_EQ(j["n_embd"], c.n_embd);
  EXPECT_EQ(j["n_head"], c.n_head);
  EXPECT_EQ(j["n_positions"], c.max_seq_len);
  EXPECT_EQ(j["vocab_size"], c.vocab_size);
  EXPECT_FLOAT_EQ(j["layer_norm_epsilon"].get<float>(), c.norm_eps);
  expect_same_config(model_config_from_hf_json(j, "config.json"), c);
}

TEST(ModelConfigJson, HfLlamaKeysAndRoundTrip) {
  const ModelConfig c = model_preset("llama-tiny");
  const json j = hf_config_to_json(c);
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["hidden_size"], c.n_embd);
  EXPECT_EQ(j["intermediate_size"], c.d_ff);
  EXPECT_EQ(j["num_hidden_layers"], c.n_layer);
  EXPECT_EQ(j["num_attention_heads"], c.n_head);
  EXPECT_EQ(j["num_key_value_heads"], c.n_kv_head);
  EXPECT_EQ(j["max_position_embeddings"], c.max_seq_len);
  EXPECT_EQ(j["vocab_size"], c.vocab_size);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_FLOAT_EQ(j["rms_norm_eps"].get<float>(), c.norm_eps);
  EXPECT_FLOAT_EQ(j["rope_theta"].get<float>(), c.rope_theta);
  expect_same_config(model_config_from_hf_json(j, "config.json"), c);
}

TEST(ModelConfigJson, BadKeysAreErrorsNamingWhereAndKey) {
  expect_error([] { model_config_from_json(json{{"n_layers", 2}}, "a/loom_config.json"); },
               {"a/loom_config.json", "'n_layers' is unknown"});
  expect_error([] { model_config_from_json(json{{"n_layer", "two"}}, "a/loom_config.json"); },
               {"a/loom_config.json", "'n_layer'", "not an integer"});
  expect_error([] { model_config_from_json(json{{"n_head", 5}}, "f.json"); }, {"f.json", "n_head"});
  json hf = hf_config_to_json(model_preset("llama-tiny"));
  hf.erase("hidden_size");
  expect_error([&] { model_config_from_hf_json(hf, "m/config.json"); }, {"m/config.json", "'hidden_size' is missing"});
  expect_error([] { model_config_from_hf_json(json{{"model_type", "bert"}}, "m/config.json"); },
               {"m/config.json", "'model_type' = 'bert'"});
}

// A tiny HF config of model_type `type` as loom exports it, with `set` over it.
json hf_llama(const json& set = json::object(), bool mixtral = false) {
  ModelConfig c = model_preset("llama-tiny");
  if (mixtral) c.n_expert = 4;
  json j = hf_config_to_json(c);
  j.merge_patch(set);  // a null value removes the key
  return j;
}

// transformers v5 writes rope_theta inside rope_parameters; v4's rope_scaling
// may name plain RoPE too. Only plain RoPE is accepted, with one base.
TEST(ModelConfigJson, HfRopeParametersGiveThetaAndOnlyPlainRopeIsAccepted) {
  const json v5 = {{"rope_theta", nullptr}, {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}}};
  EXPECT_EQ(model_config_from_hf_json(hf_llama(v5), "c.json").rope_theta, 500000.f);
  EXPECT_EQ(model_config_from_hf_json(hf_llama({{"rope_scaling", {{"rope_type", "default"}}}}), "c.json").rope_theta,
            model_preset("llama-tiny").rope_theta);
  EXPECT_NO_THROW(model_config_from_hf_json(hf_llama({{"rope_scaling", {{"type", "default"}}}}), "c.json"));
  expect_error([] {
    const json rope = {{"rope_theta", 1e4}, {"rope_type", "linear"}};
    model_config_from_hf_json(hf_llama({{"rope_parameters", rope}}), "c.json");
  }, {"c.json: key 'rope_parameters': key 'rope_type' = 'linear' is not supported", "rope_type \"default\""});
  expect_error([] {
    model_config_from_hf_json(hf_llama({{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}}), "c.json");
  }, {"c.json: key 'rope_scaling': key 'rope_type' = 'llama3' is not supported"});
  expect_error([] {
    model_config_from_hf_json(hf_llama({{"rope_scaling", {{"rope_type", "default"}, {"factor", 8.0}}}}), "c.json");
  }, {"c.json: key 'rope_scaling': key 'factor' is not supported"});
  expect_error([] {
    const json rope = {{"rope_theta", 5e5}};
    model_config_from_hf_json(hf_llama({{"rope_theta", 10000.0}, {"rope_parameters", rope}}), "c.json");
  }, {"c.json: key 'rope_parameters.rope_theta' = 500000 differs from 'rope_theta' = 10000"});
  // MixtralConfig's default base is 1e6, LlamaConfig's 1e4.
  EXPECT_EQ(model_config_from_hf_json(hf_llama({{"rope_theta", nullptr}}, true), "c.json").rope_theta, 1e6f);
  EXPECT_EQ(model_config_from_hf_json(hf_llama({{"rope_theta", nullptr}}), "c.json").rope_theta, 1e4f);
}

TEST(ModelConfigJson, HfPartialRotaryIsRefused) {
  expect_error([] { model_config_from_hf_json(hf_llama({{"partial_rotary_factor", 0.5}}), "c.json"); },
               {"c.json: key 'partial_rotary_factor' = 0.5 is not supported", "allowed is 1.0"});
  expect_error([] {
    model_config_from_hf_json(hf_llama({{"rope_parameters", {{"partial_rotary_factor", 0.25}}}}), "c.json");
  }, {"key 'rope_parameters': key 'partial_rotary_factor' = 0.25 is not supported"});
  EXPECT_NO_THROW(model_config_from_hf_json(hf_llama({{"partial_rotary_factor", 1.0}}), "c.json"));
}

// A window at least the context long never masks anything: the same model.
TEST(ModelConfigJson, HfSlidingWindowShorterThanTheContextIsRefused) {
  const int64_t ctx = model_preset("llama-tiny").max_seq_len;
  expect_error([] { model_config_from_hf_json(hf_llama({{"sliding_window", 16}}, true), "c.json"); },
               {"c.json: key 'sliding_window' = 16 is not supported", "max_position_embeddings"});
  EXPECT_NO_THROW(model_config_from_hf_json(hf_llama({{"sliding_window", ctx}}, true), "c.json"));
  json none = hf_llama(json::object(), true);
  none["sliding_window"] = nullptr;
  EXPECT_NO_THROW(model_config_from_hf_json(none, "c.json"));
}

TEST(ModelConfigJson, HfGpt2OtherAttentionScalingsAreRefused) {
  json j = hf_config_to_json(model_preset("gpt2-tiny"));
  for (const auto& [key, value] : {std::pair{"scale_attn_weights", false}, {"scale_attn_by_inverse_layer_idx", true}}) {
    json bad = j;
    bad[key] = value;
    expect_error([&] { model_config_from_hf_json(bad, "c.json"); },
                 {std::string("c.json: key '") + key + "' = " + (value ? "true" : "false") + " is not supported"});
  }
  j["scale_attn_weights"] = true, j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = true;  // the same attention, computed in f32
  EXPECT_NO_THROW(model_config_from_hf_json(j, "c.json"));
}

TEST(ModelConfigJson, HfKeysOfOtherArchitecturesAreRefused) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"final_logit_softcapping", 30.0}, {"attn_logit_softcapping", 50.0}, {"qk_layernorm", true},
           {"use_qk_norm", true}, {"embedding_multiplier", 12.0}, {"logits_scaling", 8.0}})
    expect_error([&] { model_config_from_hf_json(hf_llama({{key, value}}), "c.json"); },
                 {"c.json: key '" + key + "' = " + value.dump() + " is not supported"});
  EXPECT_NO_THROW(model_config_from_hf_json(
      hf_llama({{"final_logit_softcapping", nullptr}, {"qk_layernorm", false}, {"logits_scaling", 1.0}}), "c.json"));
}

TEST(ModelConfigJson, HfKvHeadsNotDividingTheHeadsNameHfKeys) {
  expect_error([] { model_config_from_hf_json(hf_llama({{"num_key_value_heads", 3}}), "c.json"); },
               {"c.json: key 'num_key_value_heads' = 3 does not divide 'num_attention_heads'"});
}

// transformers' Mixtral runs every layer as MoE with a softmax router and
// renormalised top-k: loom neither writes another model under its name nor
// reads loom's keys that would compute one.
TEST(ModelConfigJson, HfMixtralExportRefusesWhatMixtralCannotRepresent) {
  ModelConfig base = model_preset("llama-tiny");
  base.n_expert = 4;
  EXPECT_NO_THROW(hf_config_to_json(base));
  const std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>> cases = {
      {[](ModelConfig& c) { c.moe_every = 2; }, "model.moe_every = 2"},
      {[](ModelConfig& c) { c.n_shared_expert = 1; }, "model.n_shared_expert = 1"},
      {[](ModelConfig& c) { c.router_score = RouterScore::sigmoid; }, "model.router_score = sigmoid"},
      {[](ModelConfig& c) { c.aux_free_rate = 0.001f; }, "model.aux_free_rate = 0.001"},
      {[](ModelConfig& c) { c.norm_topk_prob = false; }, "model.norm_topk_prob = false"}};
  for (const auto& [change, key] : cases) {
    ModelConfig c = base;
    change(c);
    expect_error([&] { hf_config_to_json(c); }, {key, "MixtralForCausalLM cannot represent it"});
  }
}

TEST(ModelConfigJson, HfMixtralKeysTransformersIgnoresAreRefusedUnlessNeutral) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"norm_topk_prob", false},
                                                                           {"moe_every", 2},
                                                                           {"n_shared_expert", 1},
                                                                           {"router_score", "sigmoid"},
                                                                           {"aux_free_rate", 0.01}})
    expect_error([&] { model_config_from_hf_json(hf_llama({{key, value}}, true), "c.json"); },
                 {"c.json: key '" + key + "' = " + value.dump() + " is not supported",
                  "transformers' Mixtral ignores it"});
  const ModelConfig c =
      model_config_from_hf_json(hf_llama({{"norm_topk_prob", true}, {"moe_every", 1}}, true), "c.json");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_every, 1);
}

TEST_F(ModelDirTest, HfExportOfAMoeMixtralCannotRepresentWritesNothing) {
  ModelConfig cfg = model_preset("llama-tiny");
  cfg.n_expert = 4, cfg.moe_every = 2;
  Pools pools;
  Model m(cfg, 1, 1, pools);
  m.init_params(3);
  expect_error([&] { save_model_dir(path("hf"), cfg, m.params(), ParamLayout::hf); },
               {"cannot write '" + path("hf") + "' as a Hugging Face model: model.moe_every = 2"});
  EXPECT_FALSE(fs::exists(path("hf")));
}

// transformers' generate and vLLM stop at generation_config.json's
// eos_token_id (an id or a list), else at config.json's.
TEST(ModelDir, GgufPathsAreKnownByTheirExtensionInAnyCase) {
  EXPECT_TRUE(is_gguf_path("m.gguf"));
  EXPECT_TRUE(is_gguf_path("/models/M.GGUF"));
  EXPECT_TRUE(is_gguf_path("x.GgUf"));
  EXPECT_FALSE(is_gguf_path("m.gguf.tmp"));
  EXPECT_FALSE(is_gguf_path("gguf"));
}

TEST_F(ModelDirTest, HfGenerationConfigEosIdsAreTheModelsStopIds) {
  save_preset(path("hf"), "llama-tiny", 1, ParamLayout::hf);
  EXPECT_TRUE(load_model_dir(path("hf")).eos_token_ids.empty());
  json cfg = read_json_file(path("hf/config.json"));
  cfg["eos_token_id"] = 5;
  write_json_file(path("hf/config.json"), cfg);
  EXPECT_EQ(load_model_dir(path("hf")).eos_token_ids, std::vector<int32_t>{5});
  write("hf/generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 7, 2]})");
  EXPECT_EQ(load_model_dir(path("hf")).eos_token_ids, (std::vector<int32_t>{2, 7}));
  write("hf/generation_config.json", R"({"eos_token_id": 3})");
  EXPECT_EQ(load_model_dir(path("hf")).eos_token_ids, std::vector<int32_t>{3});
  write("hf/generation_config.json", R"({"eos_token_id": [2, 100000]})");
  expect_error([&] { load_model_dir(path("hf")); },
               {"hf/generation_config.json: key 'eos_token_id' = [2,100000] is invalid", "(vocab_size - 1)"});
  save_preset(path("loom"), "llama-tiny", 1, ParamLayout::loom);
  EXPECT_TRUE(load_model_dir(path("loom")).eos_token_ids.empty());
}

// Splits dir/model.safetensors into shards as transformers writes them:
// tensor i to shard i % n, and model.safetensors.index.json mapping each.
void shard_weights(const fs::path& dir, int n) {
  const io::SafetensorsFile whole = io::SafetensorsFile::open((dir / kWeightsFile).string());
  std::vector<std::vector<std::vector<char>>> bytes(static_cast<size_t>(n));
  std::vector<std::vector<std::pair<std::string, Tensor>>> parts(static_cast<size_t>(n));
  json map = json::object();
  int i = 0;
  for (const auto& [name, info] : whole.tensors()) {
    const size_t k = static_cast<size_t>(i++ % n);
    std::vector<char>& b = bytes[k].emplace_back(info.nbytes());
    const Tensor t(b.data(), info.dtype, info.shape);
    whole.read(name, t);
    parts[k].emplace_back(name, t);
    map[name] = "model-0000" + std::to_string(k + 1) + "-of-0000" + std::to_string(n) + ".safetensors";
  }
  for (size_t k = 0; k < parts.size(); ++k)
    io::write_safetensors((dir / ("model-0000" + std::to_string(k + 1) + "-of-0000" + std::to_string(n) +
                                  ".safetensors")).string(), parts[k]);
  write_json_file((dir / "model.safetensors.index.json").string(), {{"metadata", {{"total_size", 0}}},
                                                                     {"weight_map", map}});
  fs::remove(dir / kWeightsFile);
}

TEST_F(ModelDirTest, HfShardedCheckpointLoadsThroughItsIndex) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig cfg = model_preset(preset);
    Pools pools;
    Model a(cfg, 1, 1, pools);
    a.init_params(5);
    const std::string dir = path(std::string("hf_") + preset);
    save_model_dir(dir, cfg, a.params(), ParamLayout::hf);
    shard_weights(dir, 3);
    const ModelDir hf = load_model_dir(dir);
    EXPECT_TRUE(hf.sharded);
    EXPECT_EQ(hf.weights, (fs::path(dir) / "model.safetensors.index.json").string());
    Model b(hf.config, 1, 1, pools);
    load_model_params(hf, b.master_params());
    EXPECT_EQ(to_floats(a.params()), to_floats(b.params())) << preset;
  }
  save_preset(path("loom"), "llama-tiny", 1, ParamLayout::loom);  // loom's format is never sharded
  shard_weights(path("loom"), 2);
  expect_error([&] { load_model_dir(path("loom")); }, {"has no model.safetensors"});
}

TEST_F(ModelDirTest, HfShardedCheckpointWithAMissingShardIsAnErrorNamingIt) {
  save_preset(path("hf"), "llama-tiny", 1, ParamLayout::hf);
  shard_weights(path("hf"), 2);
  fs::remove(path("hf/model-00002-of-00002.safetensors"));
  const ModelDir hf = load_model_dir(path("hf"));
  Pools pools;
  Model b(hf.config, 1, 1, pools);
  expect_error([&] { load_model_params(hf, b.master_params()); },
               {"model.safetensors.index.json: shard 'model-00002-of-00002.safetensors'", "is missing"});
  fs::remove(path("hf/model.safetensors.index.json"));
  expect_error([&] { load_model_dir(path("hf")); },
               {"has no model.safetensors nor model.safetensors.index.json"});
}

// Export to HF and back gives identical parameters, for both families.
TEST_F(ModelDirTest, HfExportImportRoundTripIsExact) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig cfg = model_preset(preset);
    Pools pools;
    Model a(cfg, 1, 1, pools);
    a.init_params(11);
    save_model_dir(path(std::string("hf_") + preset), cfg, a.params(), ParamLayout::hf);
    const ModelDir hf = load_model_dir(path(std::string("hf_") + preset));
    EXPECT_EQ(hf.layout, ParamLayout::hf);
    expect_same_config(hf.config, cfg);
    Model b(hf.config, 1, 1, pools);
    b.load_params(io::SafetensorsFile::open(hf.weights), hf.layout);
    EXPECT_EQ(to_floats(a.params()), to_floats(b.params())) << preset;
    save_model_dir(path(std::string("loom_") + preset), hf.config, b.params(), ParamLayout::loom);
    const ModelDir lm = load_model_dir(path(std::string("loom_") + preset));
    EXPECT_EQ(lm.layout, ParamLayout::loom);
    Model c(lm.config, 1, 1, pools);
    c.load_params(io::SafetensorsFile::open(lm.weights), lm.layout);
    EXPECT_EQ(to_floats(a.params()), to_floats(c.params())) << preset;
  }
}

TEST_F(ModelDirTest, HfGpt2FileHasConv1DLayoutAndNoLmHead) {
  const ModelConfig cfg = model_preset("gpt2-tiny");
  Pools pools;
  Model m(cfg, 1, 1, pools);
  m.init_params(1);
  save_model_dir(path("hf"), cfg, m.params(), ParamLayout::hf);
  const io::SafetensorsFile f = io::SafetensorsFile::open(path("hf/model.safetensors"));
  EXPECT_EQ(f.info("h.0.attn.c_attn.weight").shape, Shape({cfg.n_embd, 3 * cfg.n_embd}));
  EXPECT_EQ(f.info("h.0.mlp.c_fc.weight").shape, Shape({cfg.n_embd, cfg.d_ff}));
  EXPECT_FALSE(f.has("lm_head.weight"));
  EXPECT_TRUE(fs::exists(path("hf/config.json")));
}

TEST_F(ModelDirTest, MissingOrMalformedConfigIsAnErrorNamingTheFile) {
  expect_error([&] { load_model_dir(path("none")); }, {"none", "does not exist"});
  write("empty/model.safetensors", "");
  expect_error([&] { load_model_dir(path("empty")); }, {"neither loom_config.json", "nor config.json"});
  write("bad/config.json", "{\"model_type\": \"gpt2\", ");
  expect_error([&] { load_model_dir(path("bad")); }, {"bad/config.json", "not valid JSON"});
  write("nokey/config.json", "{\"model_type\": \"gpt2\", \"n_layer\": 2}");
  expect_error([&] { load_model_dir(path("nokey")); }, {"nokey/config.json", "'n_embd' is missing"});
  write("noweights/loom_config.json", "{\"preset\": \"gpt2-tiny\"}");
  expect_error([&] { load_model_dir(path("noweights")); }, {"noweights", "has no model.safetensors"});
}

TEST_F(ModelDirTest, AFileGivenAsTheDirectoryIsAnErrorNamingItsDirectory) {
  write("m/loom_config.json", "{\"preset\": \"gpt2-tiny\"}");
  expect_error([&] { load_model_dir(path("m/loom_config.json")); },
               {"'" + path("m/loom_config.json") + "' is a file, not a directory",
                "give the directory that holds it, '" + path("m") + "'"});
  write("notes.txt", "x");
  expect_error([&] { load_model_dir(path("notes.txt")); },
               {"notes.txt' is a file", "give a directory with loom_config.json or config.json"});
  fs::create_directories(path("m/model.safetensors"));  // a directory where the weights file belongs
  expect_error([&] { load_model_dir(path("m")); }, {"model.safetensors' is a directory", "must be a file"});
}

TEST_F(ModelDirTest, NewModelDirRefusesTheInputHoweverSpelled) {
  save_preset(path("m"), "gpt2-tiny", 1, ParamLayout::loom);
  fs::create_symlink(path("m"), path("link"));
  for (const std::string& out : {path("m"), path("m/"), path("m/."), path("link"), path("link/")})
    expect_error([&] { require_new_model_dir(out, "convert", path("m")); },
                 {"convert: --out '" + out + "' is the input model's directory", "give a new directory for --out"});
  expect_error([&] { require_new_model_dir(path("m"), "convert", path("m/model.safetensors")); },
               {"is the input model's directory (--model '" + path("m/model.safetensors") + "')"});
}

TEST_F(ModelDirTest, NewModelDirRefusesADirectoryHoldingAnyModelOrAFile) {
  save_preset(path("loom"), "gpt2-tiny", 1, ParamLayout::loom);
  save_preset(path("hf"), "gpt2-tiny", 1, ParamLayout::hf);
  write("weights_only/model.safetensors", "");
  write("file", "x");
  expect_error([&] { require_new_model_dir(path("loom"), "init-model"); },
               {"init-model: --out '" + path("loom") + "' already holds a model (loom_config.json, model.safetensors)",
                "init-model never writes over a model", "or delete '" + path("loom") + "' first"});
  expect_error([&] { require_new_model_dir(path("hf"), "init-model"); },
               {"already holds a model (config.json, model.safetensors)"});
  expect_error([&] { require_new_model_dir(path("weights_only"), "init-model"); },
               {"already holds a model (model.safetensors)"});
  expect_error([&] { require_new_model_dir(path("file"), "init-model"); }, {"--out '" + path("file") + "' is a file"});
  write("other/notes.txt", "x");
  EXPECT_NO_THROW(require_new_model_dir(path("other"), "init-model"));  // a directory without a model is fine
  EXPECT_NO_THROW(require_new_model_dir(path("new"), "convert", path("loom")));
}

TEST_F(ModelDirTest, SaveIntoANewDirectoryLeavesOnlyTheModel) {
  save_preset(path("a/m/"), "llama-tiny", 1, ParamLayout::loom);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path("a"))) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"m"});
  names.clear();
  for (const auto& e : fs::directory_iterator(path("a/m"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"loom_config.json", "model.safetensors"}));
}

// An HF model saved over a loom one must not leave loom_config.json, which
// would win detection and describe the old weights.
TEST_F(ModelDirTest, SaveOverAnExistingModelLoadsAsTheNewModel) {
  save_preset(path("m"), "gpt2-tiny", 1, ParamLayout::loom);
  save_preset(path("m"), "llama-tiny", 2, ParamLayout::hf);
  const ModelDir dir = load_model_dir(path("m"));
  EXPECT_EQ(dir.layout, ParamLayout::hf);
  expect_same_config(dir.config, model_preset("llama-tiny"));
  EXPECT_FALSE(fs::exists(path("m/loom_config.json")));
}

}  // namespace
}  // namespace loom::model
