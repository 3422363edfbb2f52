// Model config JSON (loom's and Hugging Face's) and model directories:
// export -> import round trips, HF key names, and errors naming file and key.
#include <algorithm>
#include <filesystem>
#include <fstream>
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

// Saves a fresh model of `preset` into dir.
void save_preset(const std::string& dir, const char* preset, uint64_t seed, ParamLayout layout) {
  const ModelConfig cfg = model_preset(preset);
  Pools pools;
  Model m(cfg, 1, 1, pools);
  m.init_params(seed);
  save_model_dir(dir, cfg, m.params(), layout);
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
