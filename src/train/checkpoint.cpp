#include "train/checkpoint.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "model/params.h"
#include "parallel/dp.h"
#include "train/checkpoint_dir.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Tensors of a rank file: the rank's packed shard (parallel/dp.h segments)
// of the f32 master weights and of the two AdamW moments.
constexpr const char* kMasterTensor = "master";
constexpr const char* kAdamMTensor = "adam_m";
constexpr const char* kAdamVTensor = "adam_v";

json shape_json(const Shape& s) {
  json a = json::array();
  for (int i = 0; i < s.ndim(); ++i) a.push_back(s[i]);
  return a;
}

// What rank r saves: its ZeRO-1 piece of every bucket, whatever the stage,
// so that the ranks of a stage-0 run (which all hold everything) each write
// 1/dp of the state and the shards cover the parameters exactly once.
std::vector<parallel::Segment> saved_segments(const parallel::DataParallel& dp, int r) {
  return parallel::shard_segments(dp.buckets(), std::max(1, dp.options().zero_stage), dp.size(), r);
}

json segments_json(const std::vector<parallel::Segment>& segments) {
  json a = json::array();
  for (const parallel::Segment& s : segments) a.push_back({s.offset, s.count, s.shard_offset});
  return a;
}

json split_json(const model::TpSplit& s) { return json::array({s.dim, s.blocks, s.extent}); }

// The file of pp rank p, dp rank d, tp rank t is named by its world rank in
// the mesh's order (pp slowest, tp fastest: mesh/layout.h, with cp = ep = 1),
// so a run without tp and pp keeps rank_<dp rank>.
int file_rank(int pp_rank, int dp_rank, int tp_rank, int dp_size, int tp_size) {
  return (pp_rank * dp_size + dp_rank) * tp_size + tp_rank;
}
int file_rank(Trainer& t) { return file_rank(t.pp_rank(), t.dp().rank(), t.tp_rank(), t.dp().size(), t.tp_size()); }

// The tensors of chunk c in its rank's file: master, adam_m and adam_v
// without pipelining (the files of format 3), chunk<c>.master, ... with it.
std::string chunk_prefix(const Trainer& t, int c) { return t.pp_size() > 1 ? concat("chunk", c, ".") : ""; }

// The layers and the dp buckets of one pipeline stage (the whole model
// without pipelining): from these the lead lists every stage's parameters
// and every rank's shard segments.
struct StageLayout {
  int64_t first = 0, count = 0;
  std::vector<parallel::Bucket> buckets;
};

// The pipeline stage a model holds, for param_specs: the whole model when
// there is one stage (the layout of format 3).
model::PpStage pp_stage(int64_t first, int64_t count, size_t stages) {
  return stages == 1 ? model::PpStage{} : model::PpStage{first, count};
}

json manifest_json(Trainer& t, const json& files, const std::vector<StageLayout>& stages) {
  const RunConfig& c = t.config();
  const parallel::DataParallel& dp = t.dp();
  // Every tp rank's flat buffer of a stage has the same layout (param_specs
  // gives each the same local shapes), so tp rank 0's offsets and the dp
  // segments are every tp rank's. A later stage's copy of the tied embedding
  // is not listed: its values are stage 0's (their gradients are summed),
  // and a resume reads it from there.
  json params = json::object(), pipeline_stages = json::array();
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::vector<model::ParamSpec> specs =
        model::param_specs(c.model, {t.tp_size(), 0}, pp_stage(stages[s].first, stages[s].count, stages.size()));
    for (const model::ParamSpec& spec : specs)
      if (!spec.pp_copy)
        params[spec.name] = {{"stage", s},
                             {"offset", spec.offset},
                             {"shape", shape_json(spec.shape)},
                             {"global_shape", shape_json(spec.global_shape)},
                             {"split", split_json(spec.split)}};
    pipeline_stages.push_back(
        {{"first_layer", stages[s].first}, {"n_layers", stages[s].count}, {"numel", model::param_count(specs)}});
  }
  // Stage s = c x pp + p is chunk c of pp rank p (parallel/pp_partition.h).
  json shards = json::array();
  const int pp = t.pp_size();
  for (size_t s = 0; s < stages.size(); ++s) {
    for (int tp_rank = 0; tp_rank < t.tp_size(); ++tp_rank) {
      for (int r = 0; r < dp.size(); ++r) {
        const auto segments =
            parallel::shard_segments(stages[s].buckets, std::max(1, dp.options().zero_stage), dp.size(), r);
        int64_t numel = 0;
        for (const parallel::Segment& seg : segments) numel += seg.count;
        const int rank = file_rank(static_cast<int>(s) % pp, r, tp_rank, dp.size(), t.tp_size());
        shards.push_back({{"rank", rank}, {"stage", s}, {"tp_rank", tp_rank}, {"dp_rank", r},
                          {"file", checkpoint_rank_file_name(rank)},
                          {"prefix", chunk_prefix(t, static_cast<int>(s) / pp)}, {"numel", numel},
                          {"segments", segments_json(segments)}});
      }
    }
  }
  const parallel::AdamWOptions& o = dp.adamw_options();
  const LrSchedule& lr = t.lr_schedule();
  json j;
  j["format"] = "loom-checkpoint";
  j["format_version"] = kCheckpointFormatVersion;
  j["step"] = t.steps_done();
  j["mesh"] = {{"dp", dp.size()}, {"tp", t.tp_size()}, {"pp", c.parallel.pp},
               {"cp", c.parallel.cp}, {"ep", c.parallel.ep}, {"zero_stage", c.parallel.zero_stage}};
  j["pipeline"] = {{"virtual_stages", t.num_chunks()}, {"stages", pipeline_stages}};
  j["config"] = run_config_to_json(c);
  j["data"] = {{"position", t.train_data().position()},
               {"epoch", t.train_data().epoch()},
               {"windows_per_epoch", t.train_data().windows_per_epoch()},
               {"shards", t.train_data().shard_paths()}};
  // The only randomness: init (overwritten by the restored parameters) and the
  // shuffle order, a function of (seed, epoch) and the position above.
  j["rng"] = {{"seed", c.train.seed}, {"shuffle", c.data.shuffle}};
  j["optimizer"] = {{"type", "adamw"},        {"steps_taken", dp.steps_taken()},
                    {"beta1", o.beta1},       {"beta2", o.beta2},
                    {"eps", o.eps},           {"weight_decay", o.weight_decay}};
  j["lr_schedule"] = {{"lr", lr.lr},       {"min_lr", lr.min_lr}, {"warmup_steps", lr.warmup_steps},
                      {"steps", lr.steps}, {"next_lr", lr.at(t.steps_done())}};
  if (const DynamicLossScaler* s = t.loss_scaler())
    j["loss_scale"] = {{"scale", s->scale()}, {"good_steps", s->good_steps()}, {"window", s->window()}};
  // numel (one stage, as in format 3): the elements of one tp rank's flat
  // buffer, which its shards cover; per stage: pipeline.stages.
  j["parameters"] = json::object();
  if (stages.size() == 1) j["parameters"]["numel"] = pipeline_stages[0]["numel"];
  j["parameters"]["global_numel"] = model::param_count(model::param_specs(c.model));
  j["parameters"]["tensors"] = params;
  j["shards"] = shards;
  j["files"] = files;
  return j;
}

// The groups that span the trainer's ranks: dp, tp and pp (each null when of one).
std::array<comm::Communicator*, 3> groups(Trainer& t) {
  return {t.dp().group(), t.tp() != nullptr ? &t.tp()->group() : nullptr, t.pp_group()};
}

// Over the whole pp x dp x tp grid: once a rank leaves the pp barrier, every
// rank of its pp group has left its tp barrier, so every rank of those tp
// groups has left its dp barrier, which every rank of those dp groups (so
// every rank of the grid) had reached.
void barrier(Trainer& t) {
  for (comm::Communicator* g : groups(t))
    if (g != nullptr) g->barrier()->wait();
}

void all_gather_i64(comm::Communicator* g, std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  if (g == nullptr) return void(std::copy(in.begin(), in.end(), out.begin()));
  g->all_gather(Tensor(out.data(), DType::i64, {static_cast<int64_t>(out.size())}),
                Tensor(const_cast<int64_t*>(in.data()), DType::i64, {static_cast<int64_t>(in.size())}))
      ->wait();
}

// Every rank's `record` (n i64 each), in file rank order (pp-major, tp
// fastest): gathered over dp, those over tp, then those over pp. Collective
// over the grid.
std::vector<int64_t> gather_records(Trainer& t, const std::vector<int64_t>& record) {
  const size_t n = record.size();
  const int dp = t.dp().size(), tp = t.tp_size(), pp = t.pp_size();
  std::vector<int64_t> over_dp(n * dp), over_tp(n * dp * tp), all(n * dp * tp * pp);
  all_gather_i64(groups(t)[0], over_dp, record);
  all_gather_i64(groups(t)[1], over_tp, over_dp);
  all_gather_i64(groups(t)[2], all, over_tp);  // [pp rank][tp rank][dp rank][n]
  std::vector<int64_t> out(all.size());
  for (int p = 0; p < pp; ++p)
    for (int r = 0; r < tp; ++r)
      for (int d = 0; d < dp; ++d)
        std::copy_n(&all[((static_cast<size_t>(p) * tp + r) * dp + d) * n], n,
                    &out[static_cast<size_t>(file_rank(p, d, r, dp, tp)) * n]);
  return out;
}

// Every pipeline stage's layout, stage order: each pp rank knows its own
// chunks' (the same on every dp and tp rank), so they are gathered over pp
// (records padded to the longest). Collective over the pp group.
std::vector<StageLayout> stage_layouts(Trainer& t) {
  std::vector<int64_t> mine;
  for (int c = 0; c < t.num_chunks(); ++c) {
    const std::vector<parallel::Bucket>& buckets = t.chunk_dp(c).buckets();
    mine.insert(mine.end(), {t.chunk(c).first_layer(), t.chunk(c).num_layers(), static_cast<int64_t>(buckets.size())});
    for (const parallel::Bucket& b : buckets) mine.insert(mine.end(), {b.first_unit, b.last_unit, b.begin, b.end});
  }
  const int pp = t.pp_size(), v = t.num_chunks();
  std::vector<int64_t> widths(pp);
  all_gather_i64(t.pp_group(), widths, {static_cast<int64_t>(mine.size())});
  const size_t width = static_cast<size_t>(*std::max_element(widths.begin(), widths.end()));
  mine.resize(width, 0);
  std::vector<int64_t> all(width * pp);
  all_gather_i64(t.pp_group(), all, mine);
  std::vector<StageLayout> stages(static_cast<size_t>(pp) * v);
  for (int p = 0; p < pp; ++p) {
    const int64_t* rec = &all[static_cast<size_t>(p) * width];
    for (int c = 0; c < v; ++c) {
      StageLayout& s = stages[static_cast<size_t>(c) * pp + p];
      s.first = *rec++, s.count = *rec++;
      const int64_t n = *rec++;
      for (int64_t b = 0; b < n; ++b, rec += 4)
        s.buckets.push_back({static_cast<int>(rec[0]), static_cast<int>(rec[1]), rec[2], rec[3]});
    }
  }
  return stages;
}

// Renames the complete tmp dir to dir. A dir of that name already there
// (an earlier run's, set aside otherwise: checkpoint_dir.h) is replaced:
// moved to dir.old first, so that a crash in between leaves one of the two.
void publish_step_dir(const fs::path& tmp, const fs::path& dir) {
  fsync_directory(tmp.string());
  std::error_code ec;
  const fs::path old = dir.string() + ".old";
  if (fs::exists(dir)) {
    fs::remove_all(old, ec);
    fs::rename(dir, old, ec);
    LOOM_REQUIRE(!ec, "cannot move the checkpoint '", dir.string(), "' aside: ", ec.message());
  }
  fs::rename(tmp, dir, ec);
  LOOM_REQUIRE(!ec, "cannot rename '", tmp.string(), "' to '", dir.string(), "': ", ec.message());
  fsync_directory(dir.parent_path().string());
  fs::remove_all(old, ec);
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

// Presence and size (digest = false), or the sha256 too, of one listed file.
void check_file(const json& f, const fs::path& dir, const std::string& where, bool digest) {
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

// Every file the manifest lists. Collective over the grid: each rank checks
// every file's presence and size, but digests only its share (file i on grid
// rank i mod pp x dp x tp), so the files are read once in all; then the first bad
// file's check is repeated by every rank, so that all throw the same error.
void check_files(Trainer& t, const json& files, const fs::path& dir, const std::string& where) {
  LOOM_REQUIRE(files.is_array() && !files.empty(), where, ": 'files' is missing or empty");
  for (const json& f : files) check_file(f, dir, where, false);
  const int64_t n = static_cast<int64_t>(files.size()), ranks = int64_t{t.dp().size()} * t.tp_size() * t.pp_size();
  int64_t first_bad = n;
  for (int64_t i = file_rank(t); i < n && first_bad == n; i += ranks) {
    try {
      check_file(files[i], dir, where, true);
    } catch (const Error&) {
      first_bad = i;
    }
  }
  const std::vector<int64_t> all = gather_records(t, {first_bad});
  first_bad = *std::min_element(all.begin(), all.end());
  if (first_bad == n) return;
  check_file(files[first_bad], dir, where, true);
  fail("checkpoint file '", (dir / files[first_bad].value("name", "")).string(),
       "' failed its sha256 check on another rank but not on this one: is checkpoint.dir shared by every rank?");
}

}  // namespace

std::string checkpoint_step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", static_cast<long long>(step));
  return buf;
}

std::string checkpoint_rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

std::string save_checkpoint(Trainer& trainer, const std::string& root, int64_t keep, const std::string& protect) {
  LOOM_REQUIRE(!root.empty(), "save_checkpoint: checkpoint.dir is not set");
  parallel::DataParallel& dp = trainer.dp();
  const bool lead = dp.rank() == 0 && trainer.tp_rank() == 0 && trainer.pp_rank() == 0;
  const std::string name = checkpoint_step_dir_name(trainer.steps_done());
  // Written as name.tmp and renamed into place once complete, so that a
  // step dir is always a complete checkpoint (checkpoint_dir.h).
  const fs::path dir = fs::path(root) / name, tmp = fs::path(root) / (name + ".tmp");
  if (lead) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    LOOM_REQUIRE(!ec, "cannot create the checkpoint directory '", tmp.string(), "': ", ec.message());
  }
  barrier(trainer);
  const std::vector<StageLayout> stages = stage_layouts(trainer);
  // Every rank writes its piece of each of its chunks: copied out of the
  // state it holds (the same segments from stage 1 on; under stage 0 a slice
  // of the whole).
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  std::vector<OwnedTensor> state;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    parallel::DataParallel& cdp = trainer.chunk_dp(c);
    OwnedTensor held = pool.empty(DType::f32, {cdp.shard_numel()});
    cdp.pack_master(held);
    const std::vector<parallel::Segment> pieces = saved_segments(cdp, cdp.rank());
    int64_t numel = 0;
    for (const parallel::Segment& s : pieces) numel += s.count;
    OwnedTensor master = pool.empty(DType::f32, {numel}), adam_m = pool.empty(DType::f32, {numel}),
                adam_v = pool.empty(DType::f32, {numel});
    for (size_t b = 0; b < pieces.size(); ++b) {  // one segment per bucket in both lists
      const parallel::Segment &to = pieces[b], &from = cdp.segments()[b];
      const int64_t at = from.shard_offset + (to.offset - from.offset);
      kernels::cast(Tensor(master).slice(0, to.shard_offset, to.count), Tensor(held).slice(0, at, to.count));
      kernels::cast(Tensor(adam_m).slice(0, to.shard_offset, to.count), cdp.m().slice(0, at, to.count));
      kernels::cast(Tensor(adam_v).slice(0, to.shard_offset, to.count), cdp.v().slice(0, at, to.count));
    }
    const std::string prefix = chunk_prefix(trainer, c);
    tensors.emplace_back(prefix + kMasterTensor, Tensor(master));
    tensors.emplace_back(prefix + kAdamMTensor, Tensor(adam_m));
    tensors.emplace_back(prefix + kAdamVTensor, Tensor(adam_v));
    state.push_back(std::move(master)), state.push_back(std::move(adam_m)), state.push_back(std::move(adam_v));
  }
  const int rank = file_rank(trainer);
  const fs::path rank_path = tmp / checkpoint_rank_file_name(rank);
  std::map<std::string, std::string> metadata{{"format", "loom-checkpoint"},
                                              {"step", std::to_string(trainer.steps_done())},
                                              {"rank", std::to_string(rank)},
                                              {"dp_rank", std::to_string(dp.rank())},
                                              {"tp_rank", std::to_string(trainer.tp_rank())}};
  if (trainer.pp_size() > 1) metadata["pp_rank"] = std::to_string(trainer.pp_rank());
  io::write_safetensors(rank_path.string(), tensors, metadata);
  // Each rank digests its own file; the lead lists them all: (bytes, sha256
  // as 64 hex characters) per rank.
  constexpr int kRecord = 9;
  std::vector<int64_t> mine(kRecord);
  mine[0] = static_cast<int64_t>(fs::file_size(rank_path));
  const std::string sha = sha256_file_hex(rank_path.string());
  std::memcpy(&mine[1], sha.data(), 64);
  const std::vector<int64_t> all = gather_records(trainer, mine);
  if (lead) {
    json files = json::array();
    for (int r = 0; r < dp.size() * trainer.tp_size() * trainer.pp_size(); ++r) {
      const int64_t* rec = &all[static_cast<size_t>(r) * kRecord];
      files.push_back({{"name", checkpoint_rank_file_name(r)},
                       {"rank", r},
                       {"bytes", rec[0]},
                       {"sha256", std::string(reinterpret_cast<const char*>(rec + 1), 64)}});
    }
    write_file_atomic((tmp / kCheckpointManifestFile).string(), manifest_json(trainer, files, stages).dump(2) + "\n");
    publish_step_dir(tmp, dir);
    write_file_atomic((fs::path(root) / kCheckpointLatestFile).string(), name + "\n");
    prune_step_dirs(root, keep, protect);
  }
  barrier(trainer);  // nobody resumes or reads before the manifest is there
  return dir.string();
}

namespace {

// A flat range [offset, offset + count) that sits at shard_offset of a packed
// buffer: a saved shard's segment (file: which file), this rank's own
// segment, or a saved tp rank's parameter run (offset global, shard_offset
// its flat offset; file: the saved tp rank).
struct Piece {
  int64_t offset = 0, count = 0, shard_offset = 0;
  int file = -1;
};

// Calls fn(piece, lo, hi) for each piece of `sorted` (by offset, disjoint,
// no empty ones) that overlaps [lo, hi), with the overlap.
template <typename Fn>
void for_each_overlap(const std::vector<Piece>& sorted, int64_t lo, int64_t hi, Fn&& fn) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), lo,
                             [](int64_t v, const Piece& p) { return v < p.offset; });
  if (it != sorted.begin()) --it;
  for (; it != sorted.end() && it->offset < hi; ++it) {
    const int64_t a = std::max(lo, it->offset), b = std::min(hi, it->offset + it->count);
    if (a < b) fn(*it, a, b);
  }
}

void sort_pieces(std::vector<Piece>& pieces) {
  std::erase_if(pieces, [](const Piece& p) { return p.count == 0; });
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
}

// How the checkpoint's run held the parameters: its tp size, its pipeline
// stages (one without pipelining), every (stage, tp rank)'s specs
// (model::param_specs of the saved config), per (stage, tp rank) its shards'
// segments (in that stage's and tp rank's flat coordinates; file: index into
// `shards`), and which stage holds each parameter.
struct SavedLayout {
  struct Stage {
    int64_t first = 0, count = 0, numel = 0;
  };
  struct Shard {
    std::string file, prefix;  // tensors prefix + master, adam_m, adam_v of file
    int64_t numel = 0;
    int open = 0;  // index into the opened files
  };
  int tp = 1, pp = 1;
  std::vector<Stage> stages;
  std::vector<std::vector<std::vector<model::ParamSpec>>> specs;  // [stage][tp rank][parameter]
  std::vector<Shard> shards;
  std::vector<std::vector<std::vector<Piece>>> segments;  // [stage][tp rank], sorted
  // Parameter name -> (stage, index in its specs); a later stage's copy of
  // the tied embedding is not one: its name leads to stage 0's.
  std::map<std::string, std::pair<int, size_t>> by_name;
};

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

// Every saved (stage, tp rank)'s parameter layout, checked against the
// manifest's record of it (tp rank 0's offsets and shapes are every tp
// rank's), and the stage holding each parameter.
void saved_specs(SavedLayout& s, const model::ModelConfig& cfg, const json& m, int64_t version,
                 const std::string& where) {
  const json& params = m.value("parameters", json::object());
  const json& tensors = params.value("tensors", json::object());
  const size_t n_stages = s.stages.size();
  for (size_t st = 0; st < n_stages; ++st) {
    const SavedLayout::Stage& stage = s.stages[st];
    const std::string at = n_stages == 1 ? "" : concat(", pipeline stage ", st);
    std::vector<std::vector<model::ParamSpec>> ranks;
    try {
      for (int r = 0; r < s.tp; ++r)
        ranks.push_back(model::param_specs(cfg, {s.tp, r}, pp_stage(stage.first, stage.count, n_stages)));
    } catch (const Error& e) {
      fail(where, ": mesh.tp = ", s.tp, at, " is not a layout of this model: ", e.what());
    }
    const int64_t P = model::param_count(ranks[0]);
    LOOM_REQUIRE(stage.numel == P, where, version < 4 ? ": parameters.numel" : concat(": pipeline.stages[", st, "].numel"),
                 " is not the ", P, " parameters per tp rank of this model at tp = ", s.tp, at);
    for (size_t i = 0; i < ranks[0].size(); ++i) {
      const model::ParamSpec& spec = ranks[0][i];
      if (spec.pp_copy) continue;
      LOOM_REQUIRE(tensors.contains(spec.name), where, ": parameters.tensors has no '", spec.name, "'");
      const json& t = tensors[spec.name];
      bool same = manifest_value<int64_t>(t, "offset", where) == spec.offset && t.value("shape", json()) == shape_json(spec.shape);
      // Format 2 predates tensor parallelism: its shapes are the global ones.
      if (version >= 3)
        same = same && t.value("global_shape", json()) == shape_json(spec.global_shape) &&
               t.value("split", json()) == split_json(spec.split);
      if (version >= 4) same = same && manifest_value<int64_t>(t, "stage", where) == static_cast<int64_t>(st);
      LOOM_REQUIRE(same, where, ": parameter '", spec.name, "' has another ", version >= 4 ? "stage, " : "",
                   "offset, shape or tp split than this loom gives the model at tp = ", s.tp, at);
      LOOM_CHECK(s.by_name.emplace(spec.name, std::make_pair(static_cast<int>(st), i)).second,
                 "load_checkpoint: parameter '", spec.name, "' is in two pipeline stages");
    }
    s.specs.push_back(std::move(ranks));
  }
}

// The saved shards, checked to cover each saved (stage, tp rank)'s flat
// parameters exactly once, and to name only files the manifest lists.
void saved_shards(SavedLayout& s, const json& m, int64_t version, const std::string& where) {
  LOOM_REQUIRE(m.contains("shards") && m["shards"].is_array() && !m["shards"].empty(), where,
               ": 'shards' is missing or empty");
  const int64_t n_stages = static_cast<int64_t>(s.stages.size());
  s.segments.assign(n_stages, std::vector<std::vector<Piece>>(s.tp));
  std::map<std::string, int> opened;
  for (const json& sh : m["shards"]) {
    const std::string file = manifest_value<std::string>(sh, "file", where);
    const auto numel = manifest_value<int64_t>(sh, "numel", where);
    const auto tp_rank = sh.contains("tp_rank") ? manifest_value<int64_t>(sh, "tp_rank", where) : 0;
    const auto stage = version >= 4 ? manifest_value<int64_t>(sh, "stage", where) : 0;
    const std::string prefix = version >= 4 ? manifest_value<std::string>(sh, "prefix", where) : "";
    LOOM_REQUIRE(tp_rank >= 0 && tp_rank < s.tp, where, ": shard '", file, "' has tp_rank ", tp_rank,
                 ": allowed are 0 to mesh.tp - 1 = ", s.tp - 1);
    LOOM_REQUIRE(stage >= 0 && stage < n_stages, where, ": shard '", file, "' has stage ", stage,
                 ": allowed are 0 to ", n_stages - 1, " (pipeline.stages)");
    const int64_t P = s.stages[stage].numel;
    LOOM_REQUIRE(numel >= 0 && numel <= P, where, ": shard '", file, "' has numel ", numel,
                 ": allowed are 0 to the ", P, " parameters of its stage and tp rank");
    // Only the files the manifest lists (and whose digests check_files
    // verified) are read, and only from the step dir.
    bool listed = false;
    for (const json& f : m.value("files", json::array()))
      listed = listed || (f.is_object() && f.value("name", std::string()) == file);
    LOOM_REQUIRE(listed && file.find('/') == std::string::npos, where, ": shard file '", file,
                 "' is not one of the files the manifest lists");
    LOOM_REQUIRE(sh.contains("segments") && sh["segments"].is_array(), where, ": shard '", file, "' has no segments");
    int64_t packed = 0;
    for (const json& seg : sh["segments"]) {
      LOOM_REQUIRE(seg.is_array() && seg.size() == 3 && seg[0].is_number_integer() && seg[1].is_number_integer() &&
                       seg[2].is_number_integer(),
                   where, ": shard '", file, "' has a malformed segment ", seg.dump(),
                   " (expected [offset, count, shard_offset])");
      const Piece g{seg[0].get<int64_t>(), seg[1].get<int64_t>(), seg[2].get<int64_t>(), static_cast<int>(s.shards.size())};
      LOOM_REQUIRE(g.offset >= 0 && g.count >= 0 && g.offset <= P && g.count <= P - g.offset &&
                       g.shard_offset >= 0 && g.shard_offset <= numel && g.count <= numel - g.shard_offset,
                   where, ": shard '", file, "' segment ", seg.dump(), " lies outside the ", P,
                   " parameters or its ", numel, "-element shard");
      packed += g.count;
      s.segments[stage][tp_rank].push_back(g);
    }
    LOOM_REQUIRE(packed == numel, where, ": shard '", file, "' segments hold ", packed, " elements, not numel ", numel);
    const int open = opened.emplace(file, static_cast<int>(opened.size())).first->second;
    s.shards.push_back({file, prefix, numel, open});
  }
  for (int64_t st = 0; st < n_stages; ++st) {
    const std::string at = n_stages == 1 ? "" : concat(" of pipeline stage ", st);
    for (int r = 0; r < s.tp; ++r) {
      sort_pieces(s.segments[st][r]);
      int64_t next = 0;
      for (const Piece& p : s.segments[st][r]) {
        LOOM_REQUIRE(p.offset == next, where, ": the shards of tp rank ", r, at,
                     p.offset < next ? " overlap" : " leave a gap", " at parameter element ", std::min(p.offset, next));
        next = p.offset + p.count;
      }
      LOOM_REQUIRE(next == s.stages[st].numel, where, ": the shards of tp rank ", r, at, " cover ", next, " of its ",
                   s.stages[st].numel, " parameters");
    }
  }
}

// One read: `count` elements at `src` of saved shard `shard` go to `dst` of
// this rank's packed shard.
struct Read {
  int shard = 0;
  int64_t src = 0, dst = 0, count = 0;
};

// Where in the saved files each element of one of this rank's chunks' dp
// segments (mine, sorted; shard_offset into the packed shard) is: a
// parameter is found by name in the saved stage that held it (a tied
// embedding's copy on the last stage: stage 0's), its global element on one
// saved tp rank (replicated ones: read from rank 0), at a flat offset of
// that stage and tp rank that one of its shards holds. Padding elements
// (vocabulary rows past the real ones) are not read: they are 0. Returns the
// reads and counts the padding elements of mine.
std::vector<Read> plan_reads(const std::vector<model::ParamSpec>& specs, const std::vector<Piece>& mine,
                             const SavedLayout& saved, int64_t& padding) {
  std::vector<Read> reads;
  padding = 0;
  for (const model::ParamSpec& spec : specs) {
    const auto found = saved.by_name.find(spec.name);
    LOOM_CHECK(found != saved.by_name.end(), "load_checkpoint: parameter '", spec.name, "' is in no saved stage");
    const auto [st, j] = found->second;
    const std::vector<std::vector<model::ParamSpec>>& held = saved.specs[st];
    std::vector<Piece> sources;  // the saved tp ranks' runs of the parameter, by global offset
    for (int r = 0; r < (held[0][j].replicated() ? 1 : saved.tp); ++r)
      for (const model::ShardRun& run : model::shard_runs(held[r][j]))
        if (run.global >= 0) sources.push_back({run.global, run.count, held[r][j].offset + run.local, r});
    sort_pieces(sources);
    for (const model::ShardRun& run : model::shard_runs(spec)) {
      const int64_t flat = spec.offset + run.local;
      if (run.global < 0) {
        for_each_overlap(mine, flat, flat + run.count, [&](const Piece&, int64_t lo, int64_t hi) { padding += hi - lo; });
        continue;
      }
      for_each_overlap(sources, run.global, run.global + run.count, [&](const Piece& src, int64_t lo, int64_t hi) {
        const int64_t saved_flat = src.shard_offset + (lo - src.offset), new_flat = flat + (lo - run.global);
        for_each_overlap(mine, new_flat, new_flat + (hi - lo), [&](const Piece& seg, int64_t a, int64_t b) {
          const int64_t from = saved_flat + (a - new_flat), dst = seg.shard_offset + (a - seg.offset);
          for_each_overlap(saved.segments[st][src.file], from, from + (b - a), [&](const Piece& file, int64_t x, int64_t y) {
            const Read r{file.file, file.shard_offset + (x - file.offset), dst + (x - from), y - x};
            Read* last = reads.empty() ? nullptr : &reads.back();
            if (last && last->shard == r.shard && last->src + last->count == r.src && last->dst + last->count == r.dst)
              last->count += r.count;  // contiguous in both: one read
            else
              reads.push_back(r);
          });
        });
      });
    }
  }
  return reads;
}

// The saved shards' files (each opened once), each shard checked to have its
// three (numel) f32 tensors there.
std::vector<io::SafetensorsFile> open_saved_files(const SavedLayout& saved, const fs::path& dir) {
  std::vector<io::SafetensorsFile> files;
  for (const SavedLayout::Shard& shard : saved.shards) {
    if (shard.open == static_cast<int>(files.size()))
      files.push_back(io::SafetensorsFile::open((dir / shard.file).string()));
    const io::SafetensorsFile& file = files[shard.open];
    for (const char* tensor : {kMasterTensor, kAdamMTensor, kAdamVTensor}) {
      const std::string name = shard.prefix + tensor;
      LOOM_REQUIRE(file.has(name), "checkpoint file '", file.path(), "' has no tensor '", name, "'");
      const io::TensorInfo& info = file.info(name);
      LOOM_REQUIRE(info.dtype == DType::f32 && info.shape == Shape({shard.numel}), "checkpoint file '", file.path(),
                   "': tensor '", name, "' is not f32 (", shard.numel, ") as the manifest says");
    }
  }
  return files;
}

}  // namespace

int64_t load_checkpoint(Trainer& trainer, const std::string& step_dir) {
  const fs::path dir(step_dir);
  const std::string where = (dir / kCheckpointManifestFile).string();
  if (!fs::is_directory(dir)) throw IncompleteCheckpoint(concat("checkpoint '", step_dir, "' does not exist"));
  if (!fs::exists(where))
    throw IncompleteCheckpoint(concat("checkpoint manifest '", where, "' is missing: the checkpoint is incomplete"));
  nlohmann::json m;
  try {
    m = model::read_json_file(where);
  } catch (const Error& e) {
    throw IncompleteCheckpoint(e.what());
  }
  const auto version = manifest_value<int64_t>(m, "format_version", where);
  LOOM_REQUIRE(version >= 2 && version <= kCheckpointFormatVersion, where, ": format_version ", version,
               " is not supported: this loom reads format_version 2 to ", kCheckpointFormatVersion);
  LOOM_REQUIRE(m.contains("config") && m["config"].contains("model"), where, ": config.model is missing");
  check_same_model(m["config"]["model"], model::model_config_to_json(trainer.config().model), where);
  // dp, tp, pp (and the pipeline's partition) and the ZeRO stage may change
  // on resume: the state is read by parameter name and global ranges,
  // whatever the stages and shards.
  const json mesh = m.value("mesh", nlohmann::json::object());
  for (const char* axis : {"cp", "ep"})
    LOOM_REQUIRE(manifest_value<int64_t>(mesh, axis, where) == 1, where, ": mesh.", axis,
                 " is not 1: resharding a checkpoint over ", axis, " is not supported yet");
  SavedLayout saved;
  const auto saved_pp = manifest_value<int64_t>(mesh, "pp", where);
  LOOM_REQUIRE(saved_pp >= 1 && (version >= 4 || saved_pp == 1), where, ": mesh.pp = ", saved_pp,
               " is invalid: allowed are 1 to the model's layers", version < 4 ? " (1 before format 4)" : "");
  saved.pp = static_cast<int>(saved_pp);
  const auto saved_tp = manifest_value<int64_t>(mesh, "tp", where);
  const int64_t listed = m.value("shards", json::array()).size();
  LOOM_REQUIRE(saved_tp >= 1 && saved_tp <= listed && (version >= 3 || saved_tp == 1), where, ": mesh.tp = ",
               saved_tp, " is invalid: allowed are 1 to the ", listed, " shards", version < 3 ? " (1 in format 2)" : "");
  saved.tp = static_cast<int>(saved_tp);
  try {
    check_files(trainer, m.value("files", nlohmann::json()), dir, where);
  } catch (const IncompleteCheckpoint&) {
    throw;
  } catch (const Error& e) {
    throw IncompleteCheckpoint(e.what());
  }
  const auto step = manifest_value<int64_t>(m, "step", where);
  const fs::path normal = dir.lexically_normal();
  const std::string name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  const int64_t named = step_dir_step(name);
  LOOM_REQUIRE(named < 0 || named == step, where, ": step ", step, " does not match the directory name '", name,
               "': the manifest was edited or the directory renamed");
  const auto position = manifest_value<int64_t>(m.value("data", nlohmann::json::object()), "position", where);
  LOOM_REQUIRE(step >= 0 && position >= 0, where, ": step ", step, " or data.position ", position, " is negative");
  const auto updates = manifest_value<int64_t>(m.value("optimizer", nlohmann::json::object()), "steps_taken", where);
  LOOM_REQUIRE(updates >= 0 && updates <= step, where, ": optimizer.steps_taken ", updates,
               " is invalid: allowed are 0 to step = ", step);
  DynamicLossScaler* scaler = trainer.loss_scaler();
  double loss_scale = 0;
  int64_t good_steps = 0;
  if (scaler) {
    LOOM_REQUIRE(m.contains("loss_scale"), where, ": loss_scale is missing: the checkpoint was not written by an ",
                 "fp16 run, and this run is fp16");
    loss_scale = manifest_value<double>(m["loss_scale"], "scale", where);
    good_steps = manifest_value<int64_t>(m["loss_scale"], "good_steps", where);
    DynamicLossScaler check(scaler->scale(), scaler->window());
    check.restore(loss_scale, good_steps);  // a loom::Error for impossible values, before anything changes
  }
  saved_stages(saved, trainer.config().model, m, version, where);
  saved_specs(saved, trainer.config().model, m, version, where);
  saved_shards(saved, m, version, where);
  std::vector<io::SafetensorsFile> files = open_saved_files(saved, dir);
  // Everything is checked: read each chunk's segments from whichever saved
  // shards hold them, all before the trainer changes.
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  std::vector<std::array<OwnedTensor, 3>> state;  // per chunk: master, adam_m, adam_v
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    parallel::DataParallel& dp = trainer.chunk_dp(c);
    std::vector<Piece> mine;
    for (const parallel::Segment& s : dp.segments()) mine.push_back({s.offset, s.count, s.shard_offset});
    sort_pieces(mine);
    int64_t padding = 0;
    const std::vector<Read> reads = plan_reads(trainer.chunk(c).param_specs(), mine, saved, padding);
    const int64_t S = dp.shard_numel();
    std::array<OwnedTensor, 3> st{pool.zeros(DType::f32, {S}), pool.zeros(DType::f32, {S}), pool.zeros(DType::f32, {S})};
    int64_t read = 0;
    for (const Read& r : reads) {
      const SavedLayout::Shard& shard = saved.shards[r.shard];
      io::SafetensorsFile& file = files[shard.open];
      file.read_range(shard.prefix + kMasterTensor, r.src, Tensor(st[0]).slice(0, r.dst, r.count));
      file.read_range(shard.prefix + kAdamMTensor, r.src, Tensor(st[1]).slice(0, r.dst, r.count));
      file.read_range(shard.prefix + kAdamVTensor, r.src, Tensor(st[2]).slice(0, r.dst, r.count));
      read += r.count;
    }
    LOOM_CHECK(read + padding == S, "load_checkpoint: read ", read, " + padding ", padding, " of chunk ", c,
               "'s shard of ", S, " elements");
    state.push_back(std::move(st));
  }
  warn_changed_keys(m["config"], run_config_to_json(trainer.config()), where);
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    trainer.chunk_dp(c).load_state(state[c][0], state[c][1], state[c][2]);
    trainer.chunk_dp(c).set_steps_taken(updates);
  }
  trainer.set_steps_done(step);
  if (scaler) scaler->restore(loss_scale, good_steps);
  trainer.train_data().set_position(position);
  return step;
}

// ---- SHA-256, FIPS 180-4 §6.2 ----

namespace {

constexpr std::array<uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::compress(const uint8_t* p) {
  std::array<uint32_t, 64> w;
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t{p[4 * i]} << 24 | uint32_t{p[4 * i + 1]} << 16 | uint32_t{p[4 * i + 2]} << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kSha256K[i] + w[i];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
}

void Sha256::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  while (bytes > 0) {
    const size_t n = std::min(bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, n);
    buffered_ += n, p += n, bytes -= n;
    if (buffered_ == buffer_.size()) {
      compress(buffer_.data());
      buffered_ = 0;
    }
  }
}

std::array<uint8_t, 32> Sha256::finish() {
  const uint64_t bits = total_bytes_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (buffered_ != 56) update(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(length, 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(h_[i / 4] >> (24 - 8 * (i % 4)));
  return out;
}

namespace {

std::string hex(const std::array<uint8_t, 32>& digest) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (const uint8_t b : digest) s += {digits[b >> 4], digits[b & 15]};
  return s;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return hex(h.finish());
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in.good(), "cannot read '", path, "'");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  LOOM_REQUIRE(in.eof(), "reading '", path, "' failed");
  return hex(h.finish());
}

}  // namespace loom::train
