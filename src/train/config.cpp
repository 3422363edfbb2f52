#include "train/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <sstream>

#include <toml++/toml.h>

#include "core/error.h"
#include "model/config_json.h"
#include "model/params.h"

namespace loom::train {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Upper bounds of the numeric keys: far beyond any real run, low enough that
// no product or conversion downstream overflows (a step count times a batch,
// a timeout in steady_clock nanoseconds, a bucket in bytes). The model's
// sizes are bounded once, by ModelConfig::validate (model/config.h); a run
// trains at most kMaxLayers layers (start-up and pp stages scale with them).
constexpr int64_t kMaxSteps = 1'000'000'000;  // steps, and counts of steps (every, warmup, ...)
constexpr int64_t kMaxCount = 1'000'000;      // checkpoint.keep, train.eval_steps
constexpr int64_t kMaxLayers = 4096;          // model.n_layer, and pp stages / layers per stage
constexpr int64_t kMaxSeqLen = 1 << 24;       // train.seq_len
constexpr int64_t kMaxExperts = 4096;         // model.n_expert, top_k
constexpr int64_t kMaxMicroBatch = 1 << 16;   // train.micro_batch
constexpr int64_t kMaxGradAccum = 1 << 20;    // train.grad_accum (also when global_batch sets it)
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 40;
constexpr double kMaxTimeoutS = 7 * 24 * 3600;  // one week: every blocking wait of a collective

// One assignment of a key, from the file or from --set, with where it came
// from for error messages.
class Value {
 public:
  Value(const toml::node* node, std::string raw, std::string origin, std::string key)
      : node_(node), raw_(std::move(raw)), origin_(std::move(origin)), key_(std::move(key)) {}

  const std::string& key() const { return key_; }
  const std::string& origin() const { return origin_; }

  [[noreturn]] void invalid(std::string_view allowed) const {
    fail(origin_, ": ", key_, " = ", text(), " is invalid: allowed values are ", allowed);
  }

  int64_t integer(int64_t lo, int64_t hi = kIntMax) const {
    std::optional<int64_t> v = node_ != nullptr && node_->is_integer() ? node_->value<int64_t>() : std::nullopt;
    if (!v || *v < lo || *v > hi) invalid(int_range(lo, hi));
    return *v;
  }
  // A float or an integer in [lo, hi] (lo excluded when lo_open).
  double number(double lo, bool lo_open, double hi = kInf) const {
    std::optional<double> v;
    if (node_ != nullptr && (node_->is_floating_point() || node_->is_integer())) v = node_->value<double>();
    if (!v || !std::isfinite(*v) || *v < lo || (lo_open && *v == lo) || *v > hi)
      invalid(concat("numbers ", lo_open ? "> " : ">= ", lo, hi < kInf ? concat(" and <= ", hi) : ""));
    return *v;
  }
  bool boolean() const {
    if (node_ == nullptr || !node_->is_boolean()) invalid("true, false");
    return *node_->value<bool>();
  }
  // A --set value that is not valid TOML is taken as a bare string.
  std::string string() const {
    if (node_ == nullptr) return raw_;
    if (!node_->is_string()) invalid("strings");
    return *node_->value<std::string>();
  }
  std::string choice(std::initializer_list<std::string_view> allowed) const {
    return choice(std::span<const std::string_view>(allowed.begin(), allowed.size()));
  }
  std::string choice(std::span<const std::string_view> allowed) const {
    std::string v = node_ == nullptr || node_->is_string() ? string() : "";
    for (std::string_view a : allowed)
      if (v == a) return v;
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    invalid(list);
  }
  // A string, or an array of strings.
  std::vector<std::string> strings() const {
    if (node_ == nullptr || node_->is_string()) return {string()};
    std::vector<std::string> out;
    if (const toml::array* a = node_->as_array()) {
      for (const toml::node& e : *a) {
        if (!e.is_string()) invalid("a string or an array of strings");
        out.push_back(*e.value<std::string>());
      }
      if (!out.empty()) return out;
    }
    invalid("a string or a non-empty array of strings");
  }
  // A non-empty array of integers, each in [lo, hi].
  std::vector<int64_t> integers(int64_t lo, int64_t hi) const {
    std::vector<int64_t> out;
    if (const toml::array* a = node_ != nullptr ? node_->as_array() : nullptr) {
      for (const toml::node& e : *a) {
        if (!e.is_integer() || *e.value<int64_t>() < lo || *e.value<int64_t>() > hi)
          invalid(concat("a non-empty array of integers >= ", lo, " and <= ", hi));
        out.push_back(*e.value<int64_t>());
      }
    }
    if (out.empty()) invalid(concat("a non-empty array of integers >= ", lo, " and <= ", hi, ", e.g. [3, 4, 4, 1]"));
    return out;
  }

 private:
  std::string text() const {
    if (node_ == nullptr) return "'" + raw_ + "'";
    if (node_->is_string()) return "'" + *node_->value<std::string>() + "'";
    if (node_->is_table()) return "a table";
    if (node_->is_floating_point()) {  // shortest round-trip form: 0.1, not 0.10000000000000001
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof buf, *node_->value<double>());
      return std::string(buf, r.ptr);
    }
    std::ostringstream os;
    node_->visit([&](auto&& n) { os << n; });
    return os.str();
  }
  static std::string int_range(int64_t lo, int64_t hi) {
    if (hi == kIntMax) return concat("integers >= ", lo);
    if (lo == hi) return concat(lo);
    if (hi - lo <= 16) return concat("integers from ", lo, " to ", hi);  // a few choices
    return concat("integers >= ", lo, " and <= ", hi);
  }

  const toml::node* node_;
  std::string raw_;
  std::string origin_;
  std::string key_;
};

using Apply = std::function<void(RunConfig&, const Value&)>;

struct KeySpec {
  const char* section;
  const char* key;
  Apply apply;
};

// The [model] keys of a mixture of experts (model/config.h).
std::vector<KeySpec> moe_key_specs() {
  using R = RunConfig;
  using V = Value;
  auto ratio = [](float model::ModelConfig::*f, double hi) {
    return [f, hi](R& c, const V& v) { c.model.*f = static_cast<float>(v.number(0, false, hi)); };
  };
  return {
      {"model", "n_expert", [](R& c, const V& v) { c.model.n_expert = v.integer(0, kMaxExperts); }},
      {"model", "top_k", [](R& c, const V& v) { c.model.top_k = v.integer(1, kMaxExperts); }},
      {"model", "capacity_factor", ratio(&model::ModelConfig::capacity_factor, 1000)},
      {"model", "aux_loss_coef", ratio(&model::ModelConfig::aux_loss_coef, 100)},
      {"model", "z_loss_coef", ratio(&model::ModelConfig::z_loss_coef, 100)},
      {"model", "moe_every", [](R& c, const V& v) { c.model.moe_every = v.integer(1, kMaxLayers); }},
      {"model", "n_shared_expert", [](R& c, const V& v) { c.model.n_shared_expert = v.integer(0, 64); }},
      {"model", "router_score", [](R& c, const V& v) {
         c.model.router_score = model::router_score_from_name(v.choice({"softmax", "sigmoid"}));
       }},
      {"model", "norm_topk_prob", [](R& c, const V& v) { c.model.norm_topk_prob = v.boolean(); }},
      {"model", "routing_group", [](R& c, const V& v) { c.model.routing_group = v.integer(1, kMaxMicroBatch); }},
      {"model", "aux_free_rate", ratio(&model::ModelConfig::aux_free_rate, 1)},
  };
}

// ZeRO-Infinity's disk tier (parallel/offload.h).
std::vector<KeySpec> offload_key_specs() {
  using R = RunConfig;
  using V = Value;
  return {
      {"parallel", "offload", [](R& c, const V& v) { c.parallel.offload = v.choice({"none", "optimizer", "params"}); }},
      {"parallel", "offload_dir", [](R& c, const V& v) { c.parallel.offload_dir = v.string(); }},
      {"parallel", "offload_budget_mb",
       [](R& c, const V& v) { c.parallel.offload_budget_mb = v.number(0, false, 1 << 30); }},
      {"parallel", "offload_direct", [](R& c, const V& v) { c.parallel.offload_direct = v.boolean(); }},
  };
}

// Parameter-server training's keys (train/ps_server.h).
std::vector<KeySpec> ps_key_specs() {
  using R = RunConfig;
  using V = Value;
  return {
      {"parallel", "mode", [](R& c, const V& v) { c.parallel.mode = v.choice({"collective", "ps"}); }},
      {"parallel", "ps_servers", [](R& c, const V& v) { c.parallel.ps_servers = v.integer(1, 1 << 16); }},
      {"parallel", "ps_server", [](R& c, const V& v) { c.parallel.ps_server = v.choice({"sum", "optimizer"}); }},
      {"parallel", "staleness", [](R& c, const V& v) { c.parallel.staleness = v.integer(0, 1 << 20); }},
  };
}

// [lora]'s keys (model/lora.h); lora.base also sets the model (apply_all).
std::vector<KeySpec> lora_key_specs() {
  using R = RunConfig;
  using V = Value;
  return {
      {"lora", "rank", [](R& c, const V& v) { c.lora.adapters.rank = v.integer(1, 1 << 16); }},
      {"lora", "alpha", [](R& c, const V& v) { c.lora.adapters.alpha = v.number(0, true, 1e6); }},
      {"lora", "dropout", [](R& c, const V& v) { c.lora.adapters.dropout = v.number(0, false, 1); }},
      {"lora", "targets", [](R& c, const V& v) { c.lora.adapters.targets = v.strings(); }},
      {"lora", "base", [](R& c, const V& v) { c.lora.base = v.string(); }},
      {"lora", "init", [](R& c, const V& v) { c.lora.init = v.string(); }},
  };
}

// The key table: every key loom accepts, its type and allowed values.
// Defaults are not here: they are RunConfig's member initialisers.
const std::vector<KeySpec>& base_key_specs() {
  using R = RunConfig;
  using V = Value;
  static const std::vector<KeySpec> specs = {
      // model.preset is applied before every other model key (see apply_all).
      {"model", "preset", [](R& c, const V& v) {
         c.model_preset = v.string();
         try {
           c.model = model::model_preset(c.model_preset);
         } catch (const Error& e) {
           fail(v.origin(), ": ", e.what());
         }
       }},
      {"model", "family", [](R& c, const V& v) { c.model.family = model::family_from_name(v.choice({"gpt2", "llama"})); }},
      {"model", "n_layer", [](R& c, const V& v) { c.model.n_layer = v.integer(1, kMaxLayers); }},
      {"model", "n_embd", [](R& c, const V& v) { c.model.n_embd = v.integer(1); }},
      {"model", "n_head", [](R& c, const V& v) { c.model.n_head = v.integer(1); }},
      {"model", "n_kv_head", [](R& c, const V& v) { c.model.n_kv_head = v.integer(1); }},
      {"model", "d_ff", [](R& c, const V& v) { c.model.d_ff = v.integer(1); }},
      {"model", "vocab_size", [](R& c, const V& v) { c.model.vocab_size = v.integer(1, INT32_MAX); }},
      {"model", "max_seq_len", [](R& c, const V& v) { c.model.max_seq_len = v.integer(1); }},
      {"model", "rope_theta", [](R& c, const V& v) { c.model.rope_theta = static_cast<float>(v.number(0, true, 1e12)); }},
      {"model", "norm_eps", [](R& c, const V& v) { c.model.norm_eps = static_cast<float>(v.number(0, true, 1)); }},
      {"model", "tie_embeddings", [](R& c, const V& v) { c.model.tie_embeddings = v.boolean(); }},

      {"data", "train", [](R& c, const V& v) { c.data.train = v.strings(); }},
      {"data", "val", [](R& c, const V& v) { c.data.val = v.strings(); }},
      {"data", "shuffle", [](R& c, const V& v) { c.data.shuffle = v.boolean(); }},

      {"train", "seq_len", [](R& c, const V& v) { c.train.seq_len = v.integer(1, kMaxSeqLen); }},
      {"train", "micro_batch", [](R& c, const V& v) { c.train.micro_batch = v.integer(1, kMaxMicroBatch); }},
      {"train", "grad_accum", [](R& c, const V& v) { c.train.grad_accum = v.integer(1, kMaxGradAccum); }},
      {"train", "global_batch", [](R& c, const V& v) { c.train.global_batch = v.integer(0, kMaxGlobalBatch); }},
      {"train", "steps", [](R& c, const V& v) { c.train.steps = v.integer(1, kMaxSteps); }},
      {"train", "lr", [](R& c, const V& v) { c.train.lr = v.number(0, true, 10); }},
      {"train", "min_lr", [](R& c, const V& v) { c.train.min_lr = v.number(0, false, 10); }},
      {"train", "warmup_steps", [](R& c, const V& v) { c.train.warmup_steps = v.integer(0, kMaxSteps); }},
      {"train", "weight_decay", [](R& c, const V& v) { c.train.weight_decay = v.number(0, false, 10); }},
      {"train", "adam_beta1", [](R& c, const V& v) { c.train.adam_beta1 = v.number(0, false, 0.999999); }},
      {"train", "adam_beta2", [](R& c, const V& v) { c.train.adam_beta2 = v.number(0, false, 0.999999); }},
      {"train", "adam_eps", [](R& c, const V& v) { c.train.adam_eps = v.number(0, true, 1); }},
      {"train", "grad_clip", [](R& c, const V& v) { c.train.grad_clip = v.number(0, false, 1e6); }},
      {"train", "dtype", [](R& c, const V& v) { c.train.dtype = v.choice(kPrecisionNames); }},
      {"train", "loss_scale", [](R& c, const V& v) { c.train.loss_scale = v.number(0, true, 1e20); }},
      {"train", "loss_scale_window", [](R& c, const V& v) { c.train.loss_scale_window = v.integer(1, kMaxSteps); }},
      {"train", "min_loss_scale", [](R& c, const V& v) { c.train.min_loss_scale = v.number(0, true, 1e20); }},
      {"train", "max_bad_steps", [](R& c, const V& v) { c.train.max_bad_steps = v.integer(0, 1000000); }},
      {"train", "recompute", [](R& c, const V& v) { c.train.recompute = v.choice({"none", "selective", "full"}); }},
      {"train", "device", [](R& c, const V& v) { c.train.device = v.choice({"cpu", "cuda"}); }},
      {"train", "seed", [](R& c, const V& v) { c.train.seed = static_cast<uint64_t>(v.integer(0)); }},
      {"train", "eval_every", [](R& c, const V& v) { c.train.eval_every = v.integer(0, kMaxSteps); }},
      {"train", "eval_steps", [](R& c, const V& v) { c.train.eval_steps = v.integer(1, kMaxCount); }},

      {"parallel", "dp", [](R& c, const V& v) { c.parallel.dp = v.integer(1, 1 << 20); }},
      {"parallel", "tp", [](R& c, const V& v) { c.parallel.tp = v.integer(1, 1 << 16); }},
      {"parallel", "pp", [](R& c, const V& v) { c.parallel.pp = v.integer(1, 1 << 16); }},
      {"parallel", "cp", [](R& c, const V& v) { c.parallel.cp = v.integer(1, 1 << 16); }},
      {"parallel", "cp_algo", [](R& c, const V& v) { c.parallel.cp_algo = v.choice({"ring", "allgather"}); }},
      {"parallel", "ep", [](R& c, const V& v) { c.parallel.ep = v.integer(1, 1 << 16); }},
      {"parallel", "ep_overlap", [](R& c, const V& v) { c.parallel.ep_overlap = v.boolean(); }},
      {"parallel", "zero_stage", [](R& c, const V& v) { c.parallel.zero_stage = v.integer(0, 3); }},
      {"parallel", "sequence_parallel", [](R& c, const V& v) { c.parallel.sequence_parallel = v.boolean(); }},
      {"parallel", "pp_schedule", [](R& c, const V& v) { c.parallel.pp_schedule = v.choice({"afab", "1f1b", "interleaved"}); }},
      {"parallel", "virtual_stages", [](R& c, const V& v) { c.parallel.virtual_stages = v.integer(1, kMaxLayers); }},
      {"parallel", "pp_layers", [](R& c, const V& v) { c.parallel.pp_layers = v.integers(1, kMaxLayers); }},
      {"parallel", "bucket_mb", [](R& c, const V& v) { c.parallel.bucket_mb = v.number(0, true, 65536); }},
      {"parallel", "offload_optimizer", [](R& c, const V& v) { c.parallel.offload_optimizer = v.boolean(); }},
      {"parallel", "comm_algo", [](R& c, const V& v) { c.parallel.comm_algo = v.choice({"mpi", "ring"}); }},
      {"parallel", "timeout_s", [](R& c, const V& v) { c.parallel.timeout_s = v.number(0, true, kMaxTimeoutS); }},

      {"checkpoint", "dir", [](R& c, const V& v) { c.checkpoint.dir = v.string(); }},
      {"checkpoint", "every", [](R& c, const V& v) {
         c.checkpoint.every = v.integer(0, kMaxSteps);
       }},
      {"checkpoint", "keep", [](R& c, const V& v) { c.checkpoint.keep = v.integer(0, kMaxCount); }},
      {"checkpoint", "resume", [](R& c, const V& v) {
         c.checkpoint.resume = v.string();
         if (c.checkpoint.resume.empty()) v.invalid("auto, never or a checkpoint path");
       }},
  };
  return specs;
}

std::vector<KeySpec> log_key_specs() {
  using R = RunConfig;
  using V = Value;
  return {
      {"log", "metrics", [](R& c, const V& v) { c.log.metrics = v.string(); }},
      {"log", "every", [](R& c, const V& v) { c.log.every = v.integer(1, kMaxSteps); }},
      {"log", "trace", [](R& c, const V& v) { c.log.trace = v.string(); }},
      {"log", "trace_ops", [](R& c, const V& v) { c.log.trace_ops = v.boolean(); }},
      {"log", "peak_tflops", [](R& c, const V& v) { c.log.peak_tflops = v.number(0, false, 1e6); }},
  };
}

// Every key: the table, with the MoE keys after the other [model] keys, the
// offload's and parameter server's after the other [parallel] keys, then
// [log]'s and [lora]'s.
const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> all = [] {
    std::vector<KeySpec> v = base_key_specs(), moe = moe_key_specs(), ps = ps_key_specs(), lora = lora_key_specs();
    const std::vector<KeySpec> offload = offload_key_specs(), log = log_key_specs();
    const auto before = [&v](const char* section) {
      return std::find_if(v.begin(), v.end(), [&](const KeySpec& k) { return k.section == std::string_view(section); });
    };
    v.insert(before("data"), moe.begin(), moe.end());
    v.insert(before("checkpoint"), offload.begin(), offload.end());
    v.insert(before("checkpoint"), ps.begin(), ps.end());
    v.insert(v.end(), log.begin(), log.end());
    v.insert(v.end(), lora.begin(), lora.end());
    return v;
  }();
  return all;
}

const KeySpec* find_key(std::string_view section, std::string_view key) {
  for (const KeySpec& s : key_specs())
    if (section == s.section && key == s.key) return &s;
  return nullptr;
}

std::string allowed_sections() {
  std::string out;
  for (const KeySpec& s : key_specs()) {
    std::string name = concat("[", s.section, "]");
    if (out.find(name) == std::string::npos) out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

std::string allowed_keys(std::string_view section) {
  std::string out;
  for (const KeySpec& s : key_specs())
    if (section == s.section) out += (out.empty() ? "" : ", ") + std::string(s.key);
  return out;
}

// Fails unless section.key is in the table.
void require_known(std::string_view section, std::string_view key, const std::string& origin) {
  if (allowed_keys(section).empty())
    fail(origin, ": unknown section [", section, "]: allowed sections are ", allowed_sections());
  if (!key.empty() && find_key(section, key) == nullptr)
    fail(origin, ": unknown key ", section, ".", key, ": allowed keys in [", section, "] are ", allowed_keys(section));
}

std::string line_origin(const std::string& source, const toml::node& n) {
  const auto line = n.source().begin.line;
  return line > 0 ? concat(source, ":", line) : source;
}

struct Parsed {
  std::vector<std::unique_ptr<toml::table>> tables;  // own every node the values point to
  std::map<std::string, Value> values;               // "section.key" -> its last assignment
};

void collect_file(Parsed& p, std::string_view text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    fail(source, ":", e.source().begin.line, ": invalid TOML: ", e.description());
  }
  p.tables.push_back(std::make_unique<toml::table>(std::move(table)));
  for (auto&& [section_key, section_node] : *p.tables.back()) {
    const std::string section(section_key.str());
    const std::string origin = line_origin(source, section_node);
    const toml::table* section_table = section_node.as_table();
    if (section_table == nullptr) {
      if (allowed_keys(section).empty())
        fail(origin, ": unknown key ", section, ": keys live in the sections ", allowed_sections());
      fail(origin, ": ", section, " must be a section [", section, "], not a value");
    }
    require_known(section, "", origin);
    for (auto&& [key, node] : *section_table) {
      const std::string key_origin = line_origin(source, node);
      require_known(section, key.str(), key_origin);
      const std::string full = section + "." + std::string(key.str());
      p.values.insert_or_assign(full, Value(&node, "", key_origin, full));
    }
  }
}

void collect_override(Parsed& p, const std::string& arg) {
  const std::string origin = concat("--set ", arg);
  const size_t eq = arg.find('=');
  const size_t dot = arg.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    fail(origin, ": expected section.key=value, e.g. --set train.lr=3e-4");
  const std::string section = arg.substr(0, dot), key = arg.substr(dot + 1, eq - dot - 1), raw = arg.substr(eq + 1);
  if (key.empty()) fail(origin, ": the key after '", section, ".' is empty: expected section.key=value");
  require_known(section, key, origin);
  // The value is TOML (3e-4, true, "x", ["a", "b"]); anything else is a bare string.
  const toml::node* node = nullptr;
  try {
    auto table = std::make_unique<toml::table>(toml::parse(std::string_view("v = " + raw), std::string_view("--set")));
    node = table->get("v");
    p.tables.push_back(std::move(table));
  } catch (const toml::parse_error&) {
  }
  const std::string full = section + "." + key;
  p.values.insert_or_assign(full, Value(node, raw, origin, full));
}

// lora.base gives the run its model: its config, with no [model] key beside.
void take_model_from_base(RunConfig& c, const Parsed& p, const Value& base) {
  for (const auto& [full, value] : p.values)
    if (full.starts_with("model."))
      fail(value.origin(), ": ", full, " is set, but lora.base = '", c.lora.base, "' gives the model (",
           base.origin(), "): remove the [model] keys");
  try {
    c.model = model::load_model_dir(c.lora.base).config;
  } catch (const Error& e) {
    fail(base.origin(), ": lora.base: ", e.what());
  }
}

RunConfig apply_all(const Parsed& p) {
  RunConfig c;
  // The preset first: explicit model keys override it whatever their order.
  if (auto it = p.values.find("model.preset"); it != p.values.end()) find_key("model", "preset")->apply(c, it->second);
  for (const auto& [full, value] : p.values) {
    if (full == "model.preset") continue;
    const size_t dot = full.find('.');
    find_key(full.substr(0, dot), full.substr(dot + 1))->apply(c, value);
  }
  // train.global_batch (Megatron's global batch size) sets grad_accum.
  if (auto it = p.values.find("train.global_batch"); it != p.values.end() && c.train.global_batch > 0) {
    const int64_t G = c.train.global_batch, per_micro = c.parallel.dp * c.train.micro_batch;
    if (G % per_micro != 0)
      fail(it->second.origin(), ": train.global_batch = ", G, " is not divisible by parallel.dp x train.micro_batch = ",
           c.parallel.dp, " x ", c.train.micro_batch, " = ", per_micro, ": allowed values are multiples of ", per_micro);
    const int64_t accum = G / per_micro;
    if (accum > kMaxGradAccum)
      fail(it->second.origin(), ": train.global_batch = ", G, " needs train.grad_accum = ", accum,
           ", more than its maximum ", kMaxGradAccum, ": allowed values are up to ", kMaxGradAccum * per_micro);
    if (p.values.contains("train.grad_accum") && c.train.grad_accum != accum)
      fail(it->second.origin(), ": train.global_batch = ", G, " with parallel.dp = ", c.parallel.dp,
           " and train.micro_batch = ", c.train.micro_batch, " needs train.grad_accum = ", accum,
           ", but train.grad_accum = ", c.train.grad_accum, ": set only one of them");
    c.train.grad_accum = accum;
  }
  model::derive_model_keys(c.model, p.values.contains("model.n_kv_head"));
  if (auto it = p.values.find("lora.base"); it != p.values.end()) take_model_from_base(c, p, it->second);
  return c;
}

}  // namespace

RunConfig parse_run_config(std::string_view toml_text, const std::string& source,
                           const std::vector<std::string>& overrides) {
  Parsed p;
  collect_file(p, toml_text, source);
  for (const std::string& arg : overrides) collect_override(p, arg);
  RunConfig c = apply_all(p);
  // The rules across keys: any key they check may come from the file or a
  // --set, so the message names both.
  std::string where = source;
  for (size_t i = 0; i < overrides.size(); ++i) where += concat(i == 0 ? " with --set " : ", --set ", overrides[i]);
  validate_run_config(c, where);
  return c;
}

mesh::MeshShape mesh_shape(const ParallelConfig& p) {
  return {static_cast<int>(p.pp), static_cast<int>(p.dp), static_cast<int>(p.cp), static_cast<int>(p.tp),
          static_cast<int>(p.ep)};
}

DType compute_dtype(const TrainConfig& t) { return precision_dtype(t.dtype, "train.dtype"); }

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  // An ifstream opens a directory and reads it as empty, which would read as
  // a config without keys ("data.train is missing").
  std::error_code ec;
  LOOM_REQUIRE(!std::filesystem::is_directory(path, ec), "config '", path,
               "' is a directory: a TOML file is expected (e.g. configs/tiny.toml)");
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in.good(), "config '", path, "' cannot be read: no such file or not readable");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), path, overrides);
}

}  // namespace loom::train
