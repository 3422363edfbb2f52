#include "train/checkpoint_manifest.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "model/config_json.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

json shape_json(const Shape& s) {
  json a = json::array();
  for (int i = 0; i < s.ndim(); ++i) a.push_back(s[i]);
  return a;
}

json split_json(const model::TpSplit& s) { return json::array({s.dim, s.blocks, s.extent}); }

// The pipeline stage a model holds, for param_specs: the whole model when
// there is one stage (the layout of format 3).
model::PpStage pp_stage(int64_t first, int64_t count, size_t stages) {
  return stages == 1 ? model::PpStage{} : model::PpStage{first, count};
}

// Every stage's layers, stage order, from the shards (each stage has some).
std::vector<std::pair<int64_t, int64_t>> stage_layers(const std::vector<SavedShardRecord>& shards) {
  int64_t n = 0;
  for (const SavedShardRecord& r : shards) n = std::max(n, r.stage + 1);
  std::vector<std::pair<int64_t, int64_t>> layers(static_cast<size_t>(n));
  for (const SavedShardRecord& r : shards) layers[static_cast<size_t>(r.stage)] = {r.first, r.count};
  return layers;
}

// parameters.tensors and pipeline.stages. Every tp rank's flat buffer of a
// stage has the same layout (param_specs gives each the same local shapes),
// so tp rank 0's offsets and the dp segments are every tp rank's; under ep
// each ep rank's buffer holds its own experts, listed with their group and
// ep rank (the dense parameters sit at the same offsets on every ep rank). A
// later stage's copy of the tied embedding is not listed: its values are
// stage 0's (their gradients are summed), and a resume reads it from there.
std::pair<json, json> parameters_and_stages_json(Trainer& t, const std::vector<std::pair<int64_t, int64_t>>& stages) {
  const RunConfig& c = t.config();
  const int ep = c.parallel.ep;
  json params = json::object(), pipeline_stages = json::array();
  for (size_t s = 0; s < stages.size(); ++s) {
    const model::PpStage stage = pp_stage(stages[s].first, stages[s].second, stages.size());
    int64_t numel = 0;
    for (int e = 0; e < ep; ++e) {
      const auto specs = model::trainable_param_specs(c.model, c.lora.adapters, {t.tp_size(), 0}, stage, {ep, e});
      numel = model::param_count(specs);
      for (const SavedGroup& g : checkpoint_groups(specs, ep))
        for (size_t i = 0; i < g.specs.size(); ++i) {
          const model::ParamSpec& spec = g.specs[i];
          if (spec.pp_copy || params.contains(spec.name)) continue;
          json& p = params[spec.name] = {{"stage", s},
                                         {"offset", g.flat[i]},
                                         {"shape", shape_json(spec.shape)},
                                         {"global_shape", shape_json(spec.global_shape)},
                                         {"split", split_json(spec.split)},
                                         {"group", g.name}};
          if (g.name != parallel::kDenseGroup) p["ep_rank"] = e;
        }
    }
    pipeline_stages.push_back({{"first_layer", stages[s].first}, {"n_layers", stages[s].second}, {"numel", numel}});
  }
  return {params, pipeline_stages};
}

// Every rank's shards, ordered by stage, group, ep, tp, dp and cp rank:
// (stage, group, ep rank, tp rank) name the space its segments are in; dp
// and cp ranks tell the pieces apart.
json shards_json(Trainer& t, std::vector<SavedShardRecord> shards) {
  const auto key = [](const SavedShardRecord& r) {
    return std::tuple(r.stage, r.group, r.ep_rank, r.tp_rank, r.dp_rank, r.cp_rank);
  };
  std::stable_sort(shards.begin(), shards.end(),
                   [&](const SavedShardRecord& a, const SavedShardRecord& b) { return key(a) < key(b); });
  json out = json::array();
  for (const SavedShardRecord& r : shards) {
    const std::string& group = t.chunk_dp(0).group(r.group).name;
    json segments = json::array();
    for (const parallel::Segment& g : r.segments) segments.push_back({g.offset, g.count, g.shard_offset});
    out.push_back({{"rank", r.rank}, {"stage", r.stage}, {"group", group}, {"tp_rank", r.tp_rank},
                   {"ep_rank", r.ep_rank}, {"dp_rank", r.dp_rank}, {"cp_rank", r.cp_rank},
                   {"file", checkpoint_rank_file_name(r.rank)},
                   {"prefix", checkpoint_tensor_prefix(t.pp_size(), static_cast<int>(r.stage) / t.pp_size(), group)},
                   {"numel", r.numel()}, {"segments", segments}});
  }
  return out;
}

// The run's state besides the tensors: data position, RNG, optimizer, LR
// schedule and (fp16) loss scale.
void add_state_json(json& j, Trainer& t) {
  const RunConfig& c = t.config();
  const AdamWOptions& o = t.optimizer().options();
  const LrSchedule& lr = t.lr_schedule();
  j["data"] = {{"position", t.train_data().position()},
               {"epoch", t.train_data().epoch()},
               {"windows_per_epoch", t.train_data().windows_per_epoch()},
               {"shards", t.train_data().shard_paths()}};
  // The only randomness: init (overwritten by the restored parameters) and the
  // shuffle order, a function of (seed, epoch) and the position above.
  j["rng"] = {{"seed", c.train.seed}, {"shuffle", c.data.shuffle}};
  j["optimizer"] = {{"type", "adamw"},        {"steps_taken", t.optimizer().steps_taken()},
                    {"beta1", o.beta1},       {"beta2", o.beta2},
                    {"eps", o.eps},           {"weight_decay", o.weight_decay}};
  j["lr_schedule"] = {{"lr", lr.lr},       {"min_lr", lr.min_lr}, {"warmup_steps", lr.warmup_steps},
                      {"steps", lr.steps}, {"next_lr", lr.at(t.steps_done())}};
  if (const DynamicLossScaler* s = t.loss_scaler())
    j["loss_scale"] = {{"scale", s->scale()}, {"good_steps", s->good_steps()}, {"window", s->window()}};
}

template <typename T>
T manifest_value(const json& j, const char* key, const std::string& where) {
  LOOM_REQUIRE(j.is_object() && j.contains(key), where, ": key '", key, "' is missing");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    fail(where, ": key '", key, "' has the wrong type: ", j.at(key).dump());
  }
}

// The first [model] key whose value differs between the checkpoint and the run.
void check_same_model(const json& saved, const json& run, const std::string& where) {
  LOOM_REQUIRE(saved.is_object(), where, ": config.model is missing");
  for (const auto& [key, value] : run.items()) {
    LOOM_REQUIRE(saved.contains(key), where, ": the checkpoint's config.model has no key '", key, "'");
    LOOM_REQUIRE(saved.at(key) == value, where, ": the checkpoint is of another model: model.", key, " is ",
                 saved.at(key).dump(), " in the checkpoint but ", value.dump(), " in this run's config");
  }
  for (const auto& [key, value] : saved.items())
    LOOM_REQUIRE(run.contains(key), where, ": the checkpoint's config.model has an unknown key '", key, "'");
}

// The saved pipeline stages: format 4's pipeline.stages, checked to cut the
// model's layers into mesh.pp x virtual_stages contiguous stages; before
// format 4 (no pipelining) the whole model, of parameters.numel elements.
void saved_stages(SavedLayout& s, const model::ModelConfig& cfg, const json& m, int64_t version,
                  const std::string& where) {
  if (version < 4) {
    s.stages.push_back({0, cfg.n_layer, manifest_value<int64_t>(m.value("parameters", json::object()), "numel", where)});
    return;
  }
  LOOM_REQUIRE(m.contains("pipeline") && m["pipeline"].is_object(), where, ": 'pipeline' is missing");
  const json& p = m["pipeline"];
  const auto v = manifest_value<int64_t>(p, "virtual_stages", where);
  LOOM_REQUIRE(v >= 1 && p.contains("stages") && p["stages"].is_array() &&
                   static_cast<int64_t>(p["stages"].size()) == s.pp * v,
               where, ": pipeline.stages must list mesh.pp x pipeline.virtual_stages = ", s.pp, " x ", v,
               " stages");
  int64_t next = 0;
  for (const json& st : p["stages"]) {
    const SavedLayout::Stage stage{manifest_value<int64_t>(st, "first_layer", where),
                                   manifest_value<int64_t>(st, "n_layers", where),
                                   manifest_value<int64_t>(st, "numel", where)};
    LOOM_REQUIRE(stage.first == next && stage.count >= 1 && stage.count <= cfg.n_layer - next, where,
                 ": pipeline stage ", s.stages.size(), " holds layers ", stage.first, " to ",
                 stage.first + stage.count - 1, ": the stages must cut the model's ", cfg.n_layer,
                 " layers into contiguous runs of at least one, in order (next layer: ", next, ")");
    next += stage.count;
    s.stages.push_back(stage);
  }
  LOOM_REQUIRE(next == cfg.n_layer, where, ": the pipeline stages hold ", next, " of the model's ", cfg.n_layer,
               " layers");
}

// Every tp rank's flat specs of saved stage st at ep rank e (model::param_specs
// of this model at the saved tp and ep sizes), their numel checked against
// the manifest's.
std::vector<std::vector<model::ParamSpec>> saved_stage_specs(const SavedLayout& s, const model::ModelConfig& cfg,
                                                             const model::LoraConfig& lora, size_t st, int ep_rank, int64_t version,
                                                             const std::string& where) {
  const size_t n_stages = s.stages.size();
  const SavedLayout::Stage& stage = s.stages[st];
  const std::string at = n_stages == 1 ? "" : concat(", pipeline stage ", st);
  std::vector<std::vector<model::ParamSpec>> ranks;
  try {
    for (int r = 0; r < s.tp; ++r)
      ranks.push_back(model::trainable_param_specs(cfg, lora, {s.tp, r}, pp_stage(stage.first, stage.count, n_stages), {s.ep, ep_rank}));
  } catch (const Error& e) {
    fail(where, ": mesh.tp = ", s.tp, " and mesh.ep = ", s.ep, at, " are not a layout of this model: ", e.what());
  }
  const int64_t P = model::param_count(ranks[0]);
  LOOM_REQUIRE(stage.numel == P, where, version < 4 ? ": parameters.numel" : concat(": pipeline.stages[", st, "].numel"),
               " is not the ", P, " parameters per tp rank of this model at tp = ", s.tp, ", ep = ", s.ep, at);
  return ranks;
}

// Checks parameters.tensors' record of group g (tp rank 0's, of stage st and
// ep rank e): offsets and shapes are every tp rank's.
void check_saved_tensors(const json& tensors, const SavedGroup& g, size_t st, int e, int64_t version, int tp,
                         const std::string& where) {
  for (size_t i = 0; i < g.specs.size(); ++i) {
    const model::ParamSpec& spec = g.specs[i];
    if (spec.pp_copy) continue;
    LOOM_REQUIRE(tensors.contains(spec.name), where, ": parameters.tensors has no '", spec.name, "'");
    const json& t = tensors[spec.name];
    bool same = manifest_value<int64_t>(t, "offset", where) == g.flat[i] && t.value("shape", json()) == shape_json(spec.shape);
    // Format 2 predates tensor parallelism: its shapes are the global ones.
    if (version >= 3)
      same = same && t.value("global_shape", json()) == shape_json(spec.global_shape) &&
             t.value("split", json()) == split_json(spec.split);
    if (version >= 4) same = same && manifest_value<int64_t>(t, "stage", where) == static_cast<int64_t>(st);
    if (version >= 5)
      same = same && manifest_value<std::string>(t, "group", where) == g.name &&
             (g.name == parallel::kDenseGroup || manifest_value<int64_t>(t, "ep_rank", where) == e);
    LOOM_REQUIRE(same, where, ": parameter '", spec.name, "' has another ", version >= 4 ? "stage, " : "",
                 version >= 5 ? "group, ep rank, " : "", "offset, shape or tp split than this loom gives the model at tp = ",
                 tp, st > 0 ? concat(", pipeline stage ", st) : "");
  }
}

// Every saved (space, tp rank)'s parameter layout, checked against the
// manifest's record of it, and the space holding each parameter: per stage
// the dense group once and under ep each ep rank's experts.
void saved_specs(SavedLayout& s, const model::ModelConfig& cfg, const model::LoraConfig& lora, const json& m,
                 int64_t version, const std::string& where) {
  const json& params = m.value("parameters", json::object());
  const json& tensors = params.value("tensors", json::object());
  for (size_t st = 0; st < s.stages.size(); ++st) {
    for (int e = 0; e < s.ep; ++e) {
      std::vector<std::vector<SavedGroup>> ranks;  // [tp rank][group]
      for (const std::vector<model::ParamSpec>& flat : saved_stage_specs(s, cfg, lora, st, e, version, where))
        ranks.push_back(checkpoint_groups(flat, s.ep));
      for (size_t g = 0; g < ranks[0].size(); ++g) {
        const bool dense = ranks[0][g].name == parallel::kDenseGroup;
        if (dense && e > 0) continue;  // every ep rank's dense parameters are the same
        check_saved_tensors(tensors, ranks[0][g], st, e, version, s.tp, where);
        std::vector<std::vector<model::ParamSpec>> specs;
        for (std::vector<SavedGroup>& rank : ranks) specs.push_back(std::move(rank[g].specs));
        const int64_t numel = model::param_count(specs[0]);
        add_saved_space(s, {static_cast<int64_t>(st), ranks[0][g].name, dense ? 0 : e, numel}, std::move(specs));
      }
    }
  }
}

// One listed shard's segments, each checked to lie inside the P parameters
// of its stage and tp rank and inside its numel-element shard, and to add up
// to numel.
std::vector<parallel::Segment> shard_segments_of(const json& sh, const std::string& file, int64_t numel, int64_t P,
                                                 const std::string& where) {
  LOOM_REQUIRE(sh.contains("segments") && sh["segments"].is_array(), where, ": shard '", file, "' has no segments");
  std::vector<parallel::Segment> segments;
  int64_t packed = 0;
  for (const json& seg : sh["segments"]) {
    LOOM_REQUIRE(seg.is_array() && seg.size() == 3 && seg[0].is_number_integer() && seg[1].is_number_integer() &&
                     seg[2].is_number_integer(),
                 where, ": shard '", file, "' has a malformed segment ", seg.dump(),
                 " (expected [offset, count, shard_offset])");
    const parallel::Segment g{seg[0].get<int64_t>(), seg[1].get<int64_t>(), seg[2].get<int64_t>()};
    LOOM_REQUIRE(g.offset >= 0 && g.count >= 0 && g.offset <= P && g.count <= P - g.offset &&
                     g.shard_offset >= 0 && g.shard_offset <= numel && g.count <= numel - g.shard_offset,
                 where, ": shard '", file, "' segment ", seg.dump(), " lies outside the ", P,
                 " parameters or its ", numel, "-element shard");
    packed += g.count;
    segments.push_back(g);
  }
  LOOM_REQUIRE(packed == numel, where, ": shard '", file, "' segments hold ", packed, " elements, not numel ", numel);
  return segments;
}

// The space of one listed shard: its stage, its group ("dense" before
// format 5) and, for the experts, its ep rank.
int shard_space(const SavedLayout& s, const json& sh, const std::string& file, int64_t version,
                const std::string& where) {
  const int64_t n_stages = static_cast<int64_t>(s.stages.size());
  const auto stage = version >= 4 ? manifest_value<int64_t>(sh, "stage", where) : 0;
  LOOM_REQUIRE(stage >= 0 && stage < n_stages, where, ": shard '", file, "' has stage ", stage,
               ": allowed are 0 to ", n_stages - 1, " (pipeline.stages)");
  const std::string group = version >= 5 ? manifest_value<std::string>(sh, "group", where) : parallel::kDenseGroup;
  const auto ep_rank = group == parallel::kExpertGroup ? manifest_value<int64_t>(sh, "ep_rank", where) : 0;
  LOOM_REQUIRE(group == parallel::kDenseGroup || (s.ep > 1 && group == parallel::kExpertGroup), where, ": shard '",
               file, "' has group '", group, "': allowed are 'dense'", s.ep > 1 ? " and 'experts'" : " (mesh.ep = 1)");
  LOOM_REQUIRE(ep_rank >= 0 && ep_rank < s.ep, where, ": shard '", file, "' has ep_rank ", ep_rank,
               ": allowed are 0 to mesh.ep - 1 = ", s.ep - 1);
  const int space = find_saved_space(s, stage, group, static_cast<int>(ep_rank));
  LOOM_CHECK(space >= 0, "load_checkpoint: no saved space for stage ", stage, " group ", group);
  return space;
}

// One listed shard, checked (tp rank, space, numel, a file the manifest
// lists: only those, whose digests check_files verified, are read, and only
// from the step dir), added to s with its segments.
void saved_shard(SavedLayout& s, const json& m, const json& sh, int64_t version, const std::string& where) {
  const std::string file = manifest_value<std::string>(sh, "file", where);
  const auto numel = manifest_value<int64_t>(sh, "numel", where);
  const auto tp_rank = sh.contains("tp_rank") ? manifest_value<int64_t>(sh, "tp_rank", where) : 0;
  const std::string prefix = version >= 4 ? manifest_value<std::string>(sh, "prefix", where) : "";
  LOOM_REQUIRE(tp_rank >= 0 && tp_rank < s.tp, where, ": shard '", file, "' has tp_rank ", tp_rank,
               ": allowed are 0 to mesh.tp - 1 = ", s.tp - 1);
  const int space = shard_space(s, sh, file, version, where);
  const int64_t P = s.spaces[space].numel;
  LOOM_REQUIRE(numel >= 0 && numel <= P, where, ": shard '", file, "' has numel ", numel,
               ": allowed are 0 to the ", P, " parameters of its stage, group and tp rank");
  bool listed = false;
  for (const json& f : m.value("files", json::array()))
    listed = listed || (f.is_object() && f.value("name", std::string()) == file);
  LOOM_REQUIRE(listed && file.find('/') == std::string::npos, where, ": shard file '", file,
               "' is not one of the files the manifest lists");
  const std::vector<parallel::Segment> segments = shard_segments_of(sh, file, numel, P, where);
  add_saved_shard(s, {space, static_cast<int>(tp_rank), file, prefix, numel}, segments);
}

// The saved shards, checked to cover each saved (space, tp rank)'s
// parameters exactly once, and to name only files the manifest lists.
void saved_shards(SavedLayout& s, const json& m, int64_t version, const std::string& where) {
  LOOM_REQUIRE(m.contains("shards") && m["shards"].is_array() && !m["shards"].empty(), where,
               ": 'shards' is missing or empty");
  for (const json& sh : m["shards"]) saved_shard(s, m, sh, version, where);
  sort_saved_segments(s);
  for (size_t i = 0; i < s.spaces.size(); ++i) {
    const SavedLayout::Space& sp = s.spaces[i];
    const std::string at = concat(s.stages.size() == 1 ? "" : concat(" of pipeline stage ", sp.stage),
                                  s.ep == 1 ? "" : concat(" in group '", sp.group, "'"),
                                  sp.group == parallel::kExpertGroup ? concat(" of ep rank ", sp.ep_rank) : "");
    for (int r = 0; r < s.tp; ++r) {
      int64_t next = 0;
      for (const Piece& p : s.segments[i][r]) {
        LOOM_REQUIRE(p.offset == next, where, ": the shards of tp rank ", r, at,
                     p.offset < next ? " overlap" : " leave a gap", " at parameter element ", std::min(p.offset, next));
        next = p.offset + p.count;
      }
      LOOM_REQUIRE(next == sp.numel, where, ": the shards of tp rank ", r, at, " cover ", next, " of its ", sp.numel,
                   " parameters");
    }
  }
}

}  // namespace

std::string checkpoint_tensor_prefix(int pp_size, int c, const std::string& group) {
  return concat(pp_size > 1 ? concat("chunk", c, ".") : "", group == parallel::kDenseGroup ? "" : group + ".");
}

int64_t SavedShardRecord::numel() const {
  int64_t n = 0;
  for (const parallel::Segment& s : segments) n += s.count;
  return n;
}

std::vector<parallel::Segment> checkpoint_saved_segments(const std::vector<parallel::Bucket>& buckets, int zero_stage,
                                                         int dp_size, int r) {
  return parallel::shard_segments(buckets, std::max(1, zero_stage), dp_size, r);
}

json manifest_json(Trainer& t, const json& files, const std::vector<SavedShardRecord>& shards) {
  const RunConfig& c = t.config();
  const parallel::DataParallel& dp = t.dp();
  const std::vector<std::pair<int64_t, int64_t>> stages = stage_layers(shards);
  const auto [params, pipeline_stages] = parameters_and_stages_json(t, stages);
  json j;
  j["format"] = "loom-checkpoint";
  j["format_version"] = kCheckpointFormatVersion;
  j["step"] = t.steps_done();
  j["mesh"] = {{"dp", dp.size() / t.mesh().shape().cp}, {"tp", t.tp_size()}, {"pp", c.parallel.pp},
               {"cp", c.parallel.cp}, {"ep", c.parallel.ep}, {"zero_stage", c.parallel.zero_stage}};
  j["pipeline"] = {{"virtual_stages", t.num_chunks()}, {"stages", pipeline_stages}};
  j["config"] = run_config_to_json(c);
  add_state_json(j, t);
  // numel (one stage, as in format 3): the elements of one tp rank's flat
  // buffer; per stage: pipeline.stages.
  j["parameters"] = json::object();
  if (stages.size() == 1) j["parameters"]["numel"] = pipeline_stages[0]["numel"];
  j["parameters"]["global_numel"] = model::param_count(model::trainable_param_specs(c.model, c.lora.adapters));
  if (c.lora.adapters.enabled()) j["lora"] = lora_json(t);
  j["parameters"]["tensors"] = params;
  j["shards"] = shards_json(t, shards);
  j["files"] = files;
  return j;
}

nlohmann::json read_manifest(const fs::path& dir) {
  const std::string where = (dir / kCheckpointManifestFile).string();
  if (!fs::is_directory(dir)) throw IncompleteCheckpoint(concat("checkpoint '", dir.string(), "' does not exist"));
  if (!fs::exists(where))
    throw IncompleteCheckpoint(concat("checkpoint manifest '", where, "' is missing: the checkpoint is incomplete"));
  try {
    return model::read_json_file(where);
  } catch (const Error& e) {
    throw IncompleteCheckpoint(e.what());
  }
}

ManifestMesh check_manifest_mesh(const nlohmann::json& m, const nlohmann::json& run_model, const std::string& where) {
  ManifestMesh out;
  const auto version = out.version = manifest_value<int64_t>(m, "format_version", where);
  LOOM_REQUIRE(version >= 2 && version <= kCheckpointFormatVersion, where, ": format_version ", version,
               " is not supported: this loom reads format_version 2 to ", kCheckpointFormatVersion);
  LOOM_REQUIRE(m.contains("config") && m["config"].contains("model"), where, ": config.model is missing");
  check_same_model(m["config"]["model"], run_model, where);
  // dp, cp, tp, pp, ep (and the pipeline's partition) and the ZeRO stage may
  // change on resume: the state is read by parameter name and global
  // ranges, whatever the stages and shards.
  const json mesh = m.value("mesh", nlohmann::json::object());
  const auto saved_ep = mesh.contains("ep") ? manifest_value<int64_t>(mesh, "ep", where) : 1;
  LOOM_REQUIRE(saved_ep >= 1 && (version >= 5 || saved_ep == 1), where, ": mesh.ep = ", saved_ep,
               " is invalid: allowed are 1 to the model's experts", version < 5 ? " (1 before format 5)" : "");
  out.ep = static_cast<int>(saved_ep);
  const auto saved_pp = manifest_value<int64_t>(mesh, "pp", where);
  LOOM_REQUIRE(saved_pp >= 1 && (version >= 4 || saved_pp == 1), where, ": mesh.pp = ", saved_pp,
               " is invalid: allowed are 1 to the model's layers", version < 4 ? " (1 before format 4)" : "");
  out.pp = static_cast<int>(saved_pp);
  const auto saved_tp = manifest_value<int64_t>(mesh, "tp", where);
  const int64_t listed = m.value("shards", json::array()).size();
  LOOM_REQUIRE(saved_tp >= 1 && saved_tp <= listed && (version >= 3 || saved_tp == 1), where, ": mesh.tp = ",
               saved_tp, " is invalid: allowed are 1 to the ", listed, " shards", version < 3 ? " (1 in format 2)" : "");
  out.tp = static_cast<int>(saved_tp);
  return out;
}

void check_manifest_file(const json& f, const fs::path& dir, const std::string& where, bool digest) {
  const std::string name = manifest_value<std::string>(f, "name", where);
  const auto bytes = manifest_value<uint64_t>(f, "bytes", where);
  const std::string sha = manifest_value<std::string>(f, "sha256", where);
  const fs::path path = dir / name;
  LOOM_REQUIRE(fs::is_regular_file(path), "checkpoint file '", path.string(), "' is missing (listed in ", where, ")");
  const uint64_t size = fs::file_size(path);
  LOOM_REQUIRE(size >= bytes, "checkpoint file '", path.string(), "' is truncated: ", size, " bytes, but ", where,
               " says ", bytes);
  LOOM_REQUIRE(size == bytes, "checkpoint file '", path.string(), "' has ", size, " bytes, but ", where, " says ",
               bytes);
  if (!digest) return;
  const std::string actual = sha256_file_hex(path.string());
  LOOM_REQUIRE(actual == sha, "checkpoint file '", path.string(), "' is corrupted: its sha256 is ", actual, " but ",
               where, " says ", sha);
}

ManifestState manifest_state(const nlohmann::json& m, const fs::path& dir, const std::string& where,
                             const DynamicLossScaler* scaler) {
  ManifestState out;
  const auto step = out.step = manifest_value<int64_t>(m, "step", where);
  const fs::path normal = dir.lexically_normal();
  const std::string name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  const int64_t named = step_dir_step(name);
  LOOM_REQUIRE(named < 0 || named == step, where, ": step ", step, " does not match the directory name '", name,
               "': the manifest was edited or the directory renamed");
  const auto position = out.position =
      manifest_value<int64_t>(m.value("data", nlohmann::json::object()), "position", where);
  LOOM_REQUIRE(step >= 0 && position >= 0, where, ": step ", step, " or data.position ", position, " is negative");
  const auto updates = out.updates =
      manifest_value<int64_t>(m.value("optimizer", nlohmann::json::object()), "steps_taken", where);
  // Not bounded by step: asynchronous parameter servers update once a push.
  LOOM_REQUIRE(updates >= 0, where, ": optimizer.steps_taken ", updates, " is negative");
  if (scaler) {
    LOOM_REQUIRE(m.contains("loss_scale"), where, ": loss_scale is missing: the checkpoint was not written by an ",
                 "fp16 run, and this run is fp16");
    out.loss_scale = manifest_value<double>(m["loss_scale"], "scale", where);
    out.good_steps = manifest_value<int64_t>(m["loss_scale"], "good_steps", where);
    DynamicLossScaler check(scaler->scale(), scaler->window());
    check.restore(out.loss_scale, out.good_steps);  // a loom::Error for impossible values, before anything changes
  }
  return out;
}

SavedLayout saved_layout(const nlohmann::json& m, const model::ModelConfig& cfg, const model::LoraConfig& lora,
                         const ManifestMesh& mesh,
                         const std::string& where) {
  SavedLayout saved;
  saved.pp = mesh.pp, saved.tp = mesh.tp, saved.ep = mesh.ep;
  saved_stages(saved, cfg, m, mesh.version, where);
  saved_specs(saved, cfg, lora, m, mesh.version, where);
  saved_shards(saved, m, mesh.version, where);
  return saved;
}

// Train and data keys that differ from the checkpoint's run: allowed, but
// the continuation then differs from the uninterrupted run, so each is named.
// Not named: train.steps (a longer run), the eval keys (no effect on the
// state) and the shard paths (often spelled otherwise; data.position counts
// windows, whatever the files).
void warn_changed_keys(const json& saved_config, const json& run_config, const std::string& where) {
  const auto quiet = [](const std::string& key) {
    return key == "steps" || key == "eval_every" || key == "eval_steps" || key == "train" || key == "val";
  };
  for (const char* section : {"data", "train"}) {
    if (!saved_config.contains(section)) continue;
    for (const auto& [key, value] : run_config.at(section).items()) {
      const json& saved = saved_config.at(section);
      if (quiet(key) || !saved.contains(key) || saved.at(key) == value) continue;
      log_warn("resuming with ", section, ".", key, " = ", value.dump(), ", but ", where, " has ",
               saved.at(key).dump());
    }
  }
}

}  // namespace loom::train
