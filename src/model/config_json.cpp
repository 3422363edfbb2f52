#include "model/config_json.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staged_dir.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/safetensors_index.h"
#include "model/gguf_model.h"
#include "model/json_keys.h"

namespace loom::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::set<std::string> kLoomKeys = {"family",        "preset",    "n_layer",        "n_embd",
                                         "n_head",        "n_kv_head", "d_ff",           "vocab_size",
                                         "max_seq_len",   "rope_theta", "norm_eps",      "tie_embeddings",
                                         "n_expert",      "top_k",     "capacity_factor", "aux_loss_coef",
                                         "z_loss_coef",   "moe_every", "n_shared_expert", "router_score",
                                         "norm_topk_prob", "routing_group", "aux_free_rate"};

// The MoE keys beyond the four every loom_config.json carries.
void moe_keys_to_json(json& j, const ModelConfig& c) {
  j["z_loss_coef"] = decimal(c.z_loss_coef), j["moe_every"] = c.moe_every;
  j["n_shared_expert"] = c.n_shared_expert, j["router_score"] = std::string(router_score_name(c.router_score));
  j["norm_topk_prob"] = c.norm_topk_prob, j["routing_group"] = c.routing_group;
  j["aux_free_rate"] = decimal(c.aux_free_rate);
}

void moe_keys_from_json(const Keys& k, ModelConfig& c, const std::string& where) {
  k.maybe("z_loss_coef", c.z_loss_coef, &Keys::number), k.maybe("moe_every", c.moe_every, &Keys::integer);
  k.maybe("n_shared_expert", c.n_shared_expert, &Keys::integer);
  k.maybe("norm_topk_prob", c.norm_topk_prob, &Keys::boolean);
  k.maybe("routing_group", c.routing_group, &Keys::integer), k.maybe("aux_free_rate", c.aux_free_rate, &Keys::number);
  if (k.has("router_score")) {
    try {
      c.router_score = router_score_from_name(k.string("router_score"));
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
}

}  // namespace

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["family"] = std::string(family_name(c.family));
  j["n_layer"] = c.n_layer, j["n_embd"] = c.n_embd, j["n_head"] = c.n_head, j["n_kv_head"] = c.n_kv_head;
  j["d_ff"] = c.d_ff, j["vocab_size"] = c.vocab_size, j["max_seq_len"] = c.max_seq_len;
  j["rope_theta"] = decimal(c.rope_theta), j["norm_eps"] = decimal(c.norm_eps);
  j["tie_embeddings"] = c.tie_embeddings;
  j["n_expert"] = c.n_expert, j["top_k"] = c.top_k, j["capacity_factor"] = decimal(c.capacity_factor);
  j["aux_loss_coef"] = decimal(c.aux_loss_coef);
  if (c.is_moe()) moe_keys_to_json(j, c);
  return j;
}

ModelConfig model_config_from_json(const json& j, const std::string& where) {
  const Keys k(j, where);
  for (const auto& [key, value] : j.items())
    LOOM_REQUIRE(kLoomKeys.count(key), where, ": key '", key, "' is unknown: allowed keys are the [model] keys ",
                 "(family, preset, n_layer, n_embd, n_head, n_kv_head, d_ff, vocab_size, max_seq_len, rope_theta, ",
                 "norm_eps, tie_embeddings, n_expert, top_k, capacity_factor, aux_loss_coef, z_loss_coef, ",
                 "moe_every, n_shared_expert, router_score, norm_topk_prob, routing_group, aux_free_rate)");
  ModelConfig c;
  if (k.has("preset")) {
    try {
      c = model_preset(k.string("preset"));
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  if (k.has("family")) {
    try {
      c.family = family_from_name(k.string("family"));
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  k.maybe("n_layer", c.n_layer, &Keys::integer), k.maybe("n_embd", c.n_embd, &Keys::integer);
  k.maybe("n_head", c.n_head, &Keys::integer), k.maybe("n_kv_head", c.n_kv_head, &Keys::integer);
  k.maybe("d_ff", c.d_ff, &Keys::integer), k.maybe("vocab_size", c.vocab_size, &Keys::integer);
  k.maybe("max_seq_len", c.max_seq_len, &Keys::integer), k.maybe("rope_theta", c.rope_theta, &Keys::number);
  k.maybe("norm_eps", c.norm_eps, &Keys::number), k.maybe("tie_embeddings", c.tie_embeddings, &Keys::boolean);
  k.maybe("n_expert", c.n_expert, &Keys::integer), k.maybe("top_k", c.top_k, &Keys::integer);
  k.maybe("capacity_factor", c.capacity_factor, &Keys::number);
  k.maybe("aux_loss_coef", c.aux_loss_coef, &Keys::number);
  moe_keys_from_json(k, c, where);
  derive_model_keys(c, k.has("n_kv_head"));
  validate_at(c, where);
  return c;
}

ModelConfig model_config_from_sets(const std::string& preset, const std::vector<std::string>& sets,
                                   const std::string& where) {
  json j = {{"preset", preset}};
  for (const std::string& kv : sets) {
    const size_t eq = kv.find('=');
    LOOM_REQUIRE(eq != std::string::npos && eq > 0, where, ": --set '", kv,
                 "' is not key=value (e.g. vocab_size=50257)");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    j[key] = json::accept(value) ? json::parse(value) : json(value);
  }
  return model_config_from_json(j, where);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  LOOM_REQUIRE(in, "cannot open '", path, "': ", fs::exists(path) ? "not readable" : "no such file");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

void write_json_file(const std::string& path, const json& j) { write_file_atomic(path, j.dump(2) + "\n"); }

namespace {

// "m/" and "m" name the same directory.
fs::path dir_path(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

std::string parent_or_dot(const fs::path& p) { return p.has_parent_path() ? p.parent_path().string() : "."; }

// A path given as a model directory that is not one (a file, a device):
// the message says what to give instead.
void require_model_dir_path(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  LOOM_REQUIRE(fs::exists(st), "model directory '", dir, "' does not exist");
  if (fs::is_directory(st)) return;
  const std::string kind = fs::is_regular_file(st) ? "a file" : "not a directory";
  const std::string name = fs::path(dir).filename().string();
  if (name == kLoomConfigFile || name == kHfConfigFile || name == kWeightsFile)
    fail("model directory '", dir, "' is ", kind, ", not a directory: give the directory that holds it, '",
         parent_or_dot(dir), "'");
  fail("model directory '", dir, "' is ", kind, ": give a directory with ", kLoomConfigFile, " or ", kHfConfigFile,
       ", and ", kWeightsFile, ", or a .gguf file");
}

// Whether a model directory has `file`; present but not a regular file
// (a directory of that name) is a loom::Error naming it.
bool has_model_file(const fs::path& dir, const char* file) {
  std::error_code ec;
  const fs::path p = dir / file;
  const fs::file_status st = fs::status(p, ec);
  if (!fs::exists(st)) return false;
  LOOM_REQUIRE(fs::is_regular_file(st), "'", p.string(), "' is ",
               fs::is_directory(st) ? "a directory" : "not a regular file", ": a model directory's ", file,
               " must be a file");
  return true;
}

// The model files a directory holds, e.g. "loom_config.json, model.safetensors"; empty: none.
std::string model_files_in(const fs::path& dir) {
  std::string found;
  std::error_code ec;
  for (const char* f : {kLoomConfigFile, kHfConfigFile, kWeightsFile})
    if (fs::exists(dir / f, ec)) found += (found.empty() ? "" : ", ") + std::string(f);
  return found;
}

// dir/model.safetensors, then dir/<config>, each written atomically.
// The weights (given, or read a part at a time), then the config.
void write_model_files(const fs::path& dir, const ModelConfig& cfg, const Tensor* params, const FlatReader* read,
                       ParamLayout layout) {
  const bool hf = layout == ParamLayout::hf;
  if (params)
    save_params((dir / kWeightsFile).string(), param_specs(cfg), *params, layout,
                hf ? std::map<std::string, std::string>{{"format", "pt"}} : std::map<std::string, std::string>{});
  else
    save_params_streamed((dir / kWeightsFile).string(), param_specs(cfg), *read);
  write_json_file((dir / (hf ? kHfConfigFile : kLoomConfigFile)).string(),
                  hf ? hf_config_to_json(cfg) : model_config_to_json(cfg));
}

void write_model_dir(const std::string& dir, const ModelConfig& cfg, const Tensor* params, const FlatReader* read,
                     ParamLayout layout);

}  // namespace

bool is_gguf_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".gguf";
}

ModelDir load_model_dir(const std::string& dir) {
  std::error_code ec;
  if (is_gguf_path(dir) && fs::is_regular_file(dir, ec)) {
    ModelDir m;
    m.config = model_config_from_gguf(io::GgufFile::open(dir));
    m.weights = dir;
    m.gguf = true;
    return m;
  }
  require_model_dir_path(dir);
  ModelDir m;
  const fs::path loom_cfg = fs::path(dir) / kLoomConfigFile, hf_cfg = fs::path(dir) / kHfConfigFile;
  if (has_model_file(dir, kLoomConfigFile)) {
    m.config = model_config_from_json(read_json_file(loom_cfg.string()), loom_cfg.string());
    m.layout = ParamLayout::loom;
  } else if (has_model_file(dir, kHfConfigFile)) {
    m.config = model_config_from_hf_json(read_json_file(hf_cfg.string()), hf_cfg.string());
    m.layout = ParamLayout::hf;
  } else {
    fail("model directory '", dir, "' has neither ", kLoomConfigFile, " (a loom model) nor ", kHfConfigFile,
         " (a Hugging Face model)");
  }
  m.weights = (fs::path(dir) / kWeightsFile).string();
  if (m.layout == ParamLayout::hf) m.eos_token_ids = hf_eos_token_ids(dir, m.config.vocab_size);
  if (has_model_file(dir, kWeightsFile)) return m;
  // transformers' save_pretrained shards a model over its shard size (5 GB);
  // model.safetensors wins when both are there, as in transformers.
  const bool hf = m.layout == ParamLayout::hf;
  LOOM_REQUIRE(hf && has_model_file(dir, io::kSafetensorsIndexFile), "model directory '", dir, "' has no ",
               kWeightsFile, hf ? concat(" nor ", io::kSafetensorsIndexFile, " (a sharded checkpoint)") : "");
  m.weights = (fs::path(dir) / io::kSafetensorsIndexFile).string();
  m.sharded = true;
  return m;
}

void load_model_params(const ModelDir& dir, Tensor flat) {
  if (dir.gguf) return load_params_from_gguf(flat, dir.config, io::GgufFile::open(dir.weights));
  if (dir.sharded)
    return load_params(flat, param_specs(dir.config), io::SafetensorsShards::open(dir.weights), dir.layout);
  load_params(flat, param_specs(dir.config), io::SafetensorsFile::open(dir.weights), dir.layout);
}

void require_new_model_dir(const std::string& out, const std::string& command, const std::string& input) {
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (!fs::exists(st)) return;
  LOOM_REQUIRE(fs::is_directory(st), command, ": --out '", out, "' is ",
               fs::is_regular_file(st) ? "a file" : "not a directory", ": give a new directory for --out");
  if (!input.empty()) {
    // The input's directory, also when --model names a file in it.
    const fs::path in = fs::is_directory(input, ec) ? fs::path(input) : fs::path(parent_or_dot(input));
    LOOM_REQUIRE(!fs::equivalent(out, in, ec), command, ": --out '", out, "' is the input model's directory (--model '",
                 input, "'): ", command, " never writes over its input; give a new directory for --out");
  }
  const std::string found = model_files_in(out);
  LOOM_REQUIRE(found.empty(), command, ": --out '", out, "' already holds a model (", found, "): ", command,
               " never writes over a model; give a new directory for --out, or delete '", out, "' first");
}

void save_model_dir(const std::string& dir, const ModelConfig& cfg, const Tensor& params, ParamLayout layout) {
  write_model_dir(dir, cfg, &params, nullptr, layout);
}

void save_model_dir(const std::string& dir, const ModelConfig& cfg, const FlatReader& read) {
  write_model_dir(dir, cfg, nullptr, &read, ParamLayout::loom);
}

namespace {

void write_model_dir(const std::string& dir, const ModelConfig& cfg, const Tensor* params, const FlatReader* read,
                     ParamLayout layout) {
  if (layout == ParamLayout::hf)
    require_hf_exportable(cfg, concat("cannot write '", dir, "' as a Hugging Face model"));
  const fs::path target = dir_path(dir);
  std::error_code ec;
  if (fs::exists(target, ec)) {
    LOOM_REQUIRE(fs::is_directory(target, ec), "cannot write a model directory to '", dir,
                 "': it is a file, not a directory");
    // An existing directory (train --out rewriting its model): the config
    // last, and a loom config that would win detection over new HF weights
    // removed first, so no config describes weights it was not written with
    // for longer than the config's own write.
    if (layout == ParamLayout::hf) fs::remove(target / kLoomConfigFile, ec);
    write_model_files(target, cfg, params, read, layout);
    return;
  }
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    LOOM_REQUIRE(!ec, "cannot create directory '", target.parent_path().string(), "': ", ec.message());
  }
  // A new directory is written as a staging one and appears whole in one
  // rename, so a failure or a kill midway leaves no directory; commit_new,
  // as this never replaces a directory another writer created meanwhile.
  StagedDir staging(target.string(), "save");
  write_model_files(staging.path(), cfg, params, read, layout);
  staging.commit_new();
}

}  // namespace

}  // namespace loom::model
