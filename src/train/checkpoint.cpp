#include "train/checkpoint.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "parallel/dp.h"

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

// The file of tp rank t, dp rank d is named by its world rank in the mesh's
// order (tp fastest: mesh/layout.h), so a run without tp keeps rank_<dp rank>.
int file_rank(int dp_rank, int tp_rank, int tp_size) { return dp_rank * tp_size + tp_rank; }

json manifest_json(Trainer& t, const json& files) {
  const RunConfig& c = t.config();
  const parallel::DataParallel& dp = t.dp();
  // Every tp rank's flat buffer has the same layout (param_specs gives each
  // the same local shapes), so this rank's offsets and dp segments are every
  // tp rank's.
  json params = json::object();
  for (const model::ParamSpec& spec : t.model().param_specs())
    params[spec.name] = {{"offset", spec.offset},
                         {"shape", shape_json(spec.shape)},
                         {"global_shape", shape_json(spec.global_shape)},
                         {"split", split_json(spec.split)}};
  json shards = json::array();
  for (int tp_rank = 0; tp_rank < t.tp_size(); ++tp_rank) {
    for (int r = 0; r < dp.size(); ++r) {
      const auto segments = saved_segments(dp, r);
      int64_t numel = 0;
      for (const parallel::Segment& s : segments) numel += s.count;
      const int rank = file_rank(r, tp_rank, t.tp_size());
      shards.push_back({{"rank", rank}, {"tp_rank", tp_rank}, {"dp_rank", r}, {"file", checkpoint_rank_file_name(rank)},
                        {"numel", numel}, {"segments", segments_json(segments)}});
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
  // numel: the elements of one tp rank's flat buffer, which its shards cover.
  j["parameters"] = {{"numel", t.model().num_params()},
                     {"global_numel", model::param_count(model::param_specs(c.model))},
                     {"tensors", params}};
  j["shards"] = shards;
  j["files"] = files;
  return j;
}

// The groups that span the trainer's ranks: dp and tp (each null when of one).
std::array<comm::Communicator*, 2> groups(Trainer& t) {
  return {t.dp().group(), t.tp() != nullptr ? &t.tp()->group() : nullptr};
}

// Over the whole dp x tp grid: once a rank leaves the tp barrier, every rank
// of its tp group has left its dp barrier, which every rank of those dp groups
// (so every rank of the grid) had reached.
void barrier(Trainer& t) {
  for (comm::Communicator* g : groups(t))
    if (g != nullptr) g->barrier()->wait();
}

// Every rank's `record` (n i64 each), grid rank order (dp-major, tp fastest):
// gathered over dp, then those over tp. Collective over the grid.
std::vector<int64_t> gather_records(Trainer& t, const std::vector<int64_t>& record) {
  const size_t n = record.size();
  const int dp = t.dp().size(), tp = t.tp_size();
  std::vector<int64_t> over_dp(n * dp), all(n * dp * tp);
  auto gather = [](comm::Communicator* g, std::vector<int64_t>& out, const std::vector<int64_t>& in) {
    if (g == nullptr) return void(std::copy(in.begin(), in.end(), out.begin()));
    g->all_gather(Tensor(out.data(), DType::i64, {static_cast<int64_t>(out.size())}),
                  Tensor(const_cast<int64_t*>(in.data()), DType::i64, {static_cast<int64_t>(in.size())}))
        ->wait();
  };
  gather(groups(t)[0], over_dp, record);
  gather(groups(t)[1], all, over_dp);  // [tp rank][dp rank][n]
  std::vector<int64_t> out(all.size());
  for (int r = 0; r < tp; ++r)
    for (int d = 0; d < dp; ++d)
      std::copy_n(&all[(static_cast<size_t>(r) * dp + d) * n], n, &out[static_cast<size_t>(file_rank(d, r, tp)) * n]);
  return out;
}

// Step dirs under root, oldest first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step_", 0) != 0 || name.size() <= 5) continue;
    // Only names loom writes (step_ and up to 18 digits) are step dirs; any
    // other directory there is left alone.
    if (!std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) continue;
    int64_t step = 0;
    const char* first = name.data() + 5;
    const char* last = name.data() + name.size();
    const auto [end, err] = std::from_chars(first, last, step);
    if (err != std::errc() || end != last || name.size() > 5 + 18) continue;
    out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void prune_step_dirs(const fs::path& root, int64_t keep, const fs::path& newest) {
  if (keep <= 0) return;
  const auto dirs = step_dirs(root);
  const int64_t extra = static_cast<int64_t>(dirs.size()) - keep;
  for (int64_t i = 0; i < extra; ++i) {
    if (dirs[i].second == newest) continue;
    std::error_code ec;
    fs::remove_all(dirs[i].second, ec);
    LOOM_REQUIRE(!ec, "cannot delete the old checkpoint '", dirs[i].second.string(), "': ", ec.message());
  }
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
// rank i mod dp x tp), so the files are read once in all; then the first bad
// file's check is repeated by every rank, so that all throw the same error.
void check_files(Trainer& t, const json& files, const fs::path& dir, const std::string& where) {
  LOOM_REQUIRE(files.is_array() && !files.empty(), where, ": 'files' is missing or empty");
  for (const json& f : files) check_file(f, dir, where, false);
  const int64_t n = static_cast<int64_t>(files.size()), ranks = int64_t{t.dp().size()} * t.tp_size();
  int64_t first_bad = n;
  for (int64_t i = file_rank(t.dp().rank(), t.tp_rank(), t.tp_size()); i < n && first_bad == n; i += ranks) {
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

namespace {
void require_no_pipeline(Trainer& t, const char* what) {
  LOOM_REQUIRE(t.pp_size() == 1, what, ": checkpoints under pipeline parallelism (parallel.pp = ", t.pp_size(),
               ") are not implemented yet");
}
}  // namespace

std::string save_checkpoint(Trainer& trainer, const std::string& root, int64_t keep) {
  require_no_pipeline(trainer, "save_checkpoint");
  LOOM_REQUIRE(!root.empty(), "save_checkpoint: checkpoint.dir is not set");
  parallel::DataParallel& dp = trainer.dp();
  const bool lead = dp.rank() == 0 && trainer.tp_rank() == 0;
  const fs::path dir = fs::path(root) / checkpoint_step_dir_name(trainer.steps_done());
  if (lead) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    LOOM_REQUIRE(!ec, "cannot create the checkpoint directory '", dir.string(), "': ", ec.message());
    // A dir left by an earlier run is incomplete from here until the new manifest lands.
    fs::remove(dir / kCheckpointManifestFile, ec);
  }
  barrier(trainer);
  // Every rank writes its piece: copied out of the state it holds (the same
  // segments from stage 1 on; under stage 0 a slice of the whole).
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  OwnedTensor held = pool.empty(DType::f32, {dp.shard_numel()});
  dp.pack_master(held);
  const std::vector<parallel::Segment> pieces = saved_segments(dp, dp.rank());
  int64_t numel = 0;
  for (const parallel::Segment& s : pieces) numel += s.count;
  OwnedTensor master = pool.empty(DType::f32, {numel}), adam_m = pool.empty(DType::f32, {numel}),
              adam_v = pool.empty(DType::f32, {numel});
  for (size_t b = 0; b < pieces.size(); ++b) {  // one segment per bucket in both lists
    const parallel::Segment &to = pieces[b], &from = dp.segments()[b];
    const int64_t at = from.shard_offset + (to.offset - from.offset);
    kernels::cast(Tensor(master).slice(0, to.shard_offset, to.count), Tensor(held).slice(0, at, to.count));
    kernels::cast(Tensor(adam_m).slice(0, to.shard_offset, to.count), dp.m().slice(0, at, to.count));
    kernels::cast(Tensor(adam_v).slice(0, to.shard_offset, to.count), dp.v().slice(0, at, to.count));
  }
  const int rank = file_rank(dp.rank(), trainer.tp_rank(), trainer.tp_size());
  const fs::path rank_path = dir / checkpoint_rank_file_name(rank);
  io::write_safetensors(rank_path.string(),
                        {{kMasterTensor, Tensor(master)}, {kAdamMTensor, Tensor(adam_m)}, {kAdamVTensor, Tensor(adam_v)}},
                        {{"format", "loom-checkpoint"}, {"step", std::to_string(trainer.steps_done())},
                         {"rank", std::to_string(rank)}, {"dp_rank", std::to_string(dp.rank())},
                         {"tp_rank", std::to_string(trainer.tp_rank())}});
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
    for (int r = 0; r < dp.size() * trainer.tp_size(); ++r) {
      const int64_t* rec = &all[static_cast<size_t>(r) * kRecord];
      files.push_back({{"name", checkpoint_rank_file_name(r)},
                       {"rank", r},
                       {"bytes", rec[0]},
                       {"sha256", std::string(reinterpret_cast<const char*>(rec + 1), 64)}});
    }
    write_file_atomic((dir / kCheckpointManifestFile).string(), manifest_json(trainer, files).dump(2) + "\n");
    write_file_atomic((fs::path(root) / kCheckpointLatestFile).string(), dir.filename().string() + "\n");
    prune_step_dirs(root, keep, dir);
  }
  barrier(trainer);  // nobody resumes or reads before the manifest is there
  return dir.string();
}

std::string checkpoint_to_resume(const CheckpointConfig& c) {
  if (c.resume == "never") return "";
  const bool automatic = c.resume == "auto";
  const fs::path root = automatic ? fs::path(c.dir) : fs::path(c.resume);
  if (automatic && c.dir.empty()) return "";
  LOOM_REQUIRE(automatic || fs::is_directory(root), "checkpoint.resume = '", c.resume,
               "' is not a directory: allowed values are auto, never or a checkpoint step dir");
  if (!automatic && fs::exists(root / kCheckpointManifestFile)) return root.string();
  const fs::path latest = root / kCheckpointLatestFile;
  if (!fs::exists(latest)) {
    LOOM_REQUIRE(automatic, "checkpoint.resume = '", c.resume, "' holds neither ", kCheckpointManifestFile, " nor ",
                 kCheckpointLatestFile);
    return "";
  }
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  LOOM_REQUIRE(!name.empty(), "checkpoint file '", latest.string(), "' is empty: it should name a step dir");
  const fs::path target = root / name;
  LOOM_REQUIRE(fs::is_directory(target), "checkpoint file '", latest.string(), "' names '", name,
               "', which does not exist in ", root.string());
  return target.string();
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

// How the checkpoint's run held the parameters: its tp size, every tp rank's
// specs (model::param_specs of the saved config), and per tp rank its shards'
// segments (in that rank's flat coordinates; file: index into `files`).
struct SavedLayout {
  int tp = 1;
  std::vector<std::vector<model::ParamSpec>> specs;  // [tp rank][parameter]
  std::vector<std::string> files;
  std::vector<int64_t> numel;                        // [file]
  std::vector<std::vector<Piece>> segments;          // [tp rank], sorted
};

// The saved tp ranks' parameter layout, checked against the manifest's
// record of it (tp rank 0's offsets and shapes are every tp rank's).
void saved_specs(SavedLayout& s, const model::ModelConfig& cfg, const json& m, int64_t version,
                 const std::string& where) {
  try {
    for (int r = 0; r < s.tp; ++r) s.specs.push_back(model::param_specs(cfg, {s.tp, r}));
  } catch (const Error& e) {
    fail(where, ": mesh.tp = ", s.tp, " is not a layout of this model: ", e.what());
  }
  const json& params = m.value("parameters", json::object());
  const json& tensors = params.value("tensors", json::object());
  LOOM_REQUIRE(manifest_value<int64_t>(params, "numel", where) == model::param_count(s.specs[0]), where,
               ": parameters.numel is not the ", model::param_count(s.specs[0]),
               " parameters per tp rank of this model at tp = ", s.tp);
  for (const model::ParamSpec& spec : s.specs[0]) {
    LOOM_REQUIRE(tensors.contains(spec.name), where, ": parameters.tensors has no '", spec.name, "'");
    const json& t = tensors[spec.name];
    bool same = manifest_value<int64_t>(t, "offset", where) == spec.offset && t.value("shape", json()) == shape_json(spec.shape);
    // Format 2 predates tensor parallelism: its shapes are the global ones.
    if (version >= 3)
      same = same && t.value("global_shape", json()) == shape_json(spec.global_shape) &&
             t.value("split", json()) == split_json(spec.split);
    LOOM_REQUIRE(same, where, ": parameter '", spec.name, "' has another offset, shape or tp split than this loom ",
                 "gives the model at tp = ", s.tp);
  }
}

// The saved shards, checked to cover each saved tp rank's flat parameters
// exactly once, and to name only files the manifest lists.
void saved_shards(SavedLayout& s, const json& m, const std::string& where) {
  LOOM_REQUIRE(m.contains("shards") && m["shards"].is_array() && !m["shards"].empty(), where,
               ": 'shards' is missing or empty");
  const int64_t P = model::param_count(s.specs[0]);
  s.segments.assign(s.tp, {});
  for (const json& sh : m["shards"]) {
    const std::string file = manifest_value<std::string>(sh, "file", where);
    const auto numel = manifest_value<int64_t>(sh, "numel", where);
    const auto tp_rank = sh.contains("tp_rank") ? manifest_value<int64_t>(sh, "tp_rank", where) : 0;
    LOOM_REQUIRE(tp_rank >= 0 && tp_rank < s.tp, where, ": shard '", file, "' has tp_rank ", tp_rank,
                 ": allowed are 0 to mesh.tp - 1 = ", s.tp - 1);
    LOOM_REQUIRE(numel >= 0 && numel <= P, where, ": shard '", file, "' has numel ", numel,
                 ": allowed are 0 to the model's ", P, " parameters");
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
      const Piece g{seg[0].get<int64_t>(), seg[1].get<int64_t>(), seg[2].get<int64_t>(), static_cast<int>(s.files.size())};
      LOOM_REQUIRE(g.offset >= 0 && g.count >= 0 && g.offset <= P && g.count <= P - g.offset &&
                       g.shard_offset >= 0 && g.shard_offset <= numel && g.count <= numel - g.shard_offset,
                   where, ": shard '", file, "' segment ", seg.dump(), " lies outside the ", P,
                   " parameters or its ", numel, "-element shard");
      packed += g.count;
      s.segments[tp_rank].push_back(g);
    }
    LOOM_REQUIRE(packed == numel, where, ": shard '", file, "' segments hold ", packed, " elements, not numel ", numel);
    s.files.push_back(file);
    s.numel.push_back(numel);
  }
  for (int r = 0; r < s.tp; ++r) {
    sort_pieces(s.segments[r]);
    int64_t next = 0;
    for (const Piece& p : s.segments[r]) {
      LOOM_REQUIRE(p.offset == next, where, ": the shards of tp rank ", r, p.offset < next ? " overlap" : " leave a gap",
                   " at parameter element ", std::min(p.offset, next));
      next = p.offset + p.count;
    }
    LOOM_REQUIRE(next == P, where, ": the shards of tp rank ", r, " cover ", next, " of its ", P, " parameters");
  }
}

// One read: `count` elements at `src` of saved file `file` go to `dst` of
// this rank's packed shard.
struct Read {
  int file = 0;
  int64_t src = 0, dst = 0, count = 0;
};

// Where in the saved files each element of this rank's dp segments (mine,
// sorted; shard_offset into the packed shard) is: a parameter's global
// element lies on one saved tp rank (replicated ones: read from rank 0), at
// a flat offset there that one of that rank's shards holds. Padding
// elements (vocabulary rows past the real ones) are not read: they are 0.
// Returns the reads and counts the padding elements of mine.
std::vector<Read> plan_reads(const std::vector<model::ParamSpec>& specs, const std::vector<Piece>& mine,
                             const SavedLayout& saved, int64_t& padding) {
  std::vector<Read> reads;
  padding = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::vector<Piece> sources;  // the saved tp ranks' runs of parameter i, by global offset
    for (int r = 0; r < (saved.specs[0][i].replicated() ? 1 : saved.tp); ++r)
      for (const model::ShardRun& run : model::shard_runs(saved.specs[r][i]))
        if (run.global >= 0) sources.push_back({run.global, run.count, saved.specs[r][i].offset + run.local, r});
    sort_pieces(sources);
    for (const model::ShardRun& run : model::shard_runs(specs[i])) {
      const int64_t flat = specs[i].offset + run.local;
      if (run.global < 0) {
        for_each_overlap(mine, flat, flat + run.count, [&](const Piece&, int64_t lo, int64_t hi) { padding += hi - lo; });
        continue;
      }
      for_each_overlap(sources, run.global, run.global + run.count, [&](const Piece& src, int64_t lo, int64_t hi) {
        const int64_t saved_flat = src.shard_offset + (lo - src.offset), new_flat = flat + (lo - run.global);
        for_each_overlap(mine, new_flat, new_flat + (hi - lo), [&](const Piece& seg, int64_t a, int64_t b) {
          const int64_t from = saved_flat + (a - new_flat), dst = seg.shard_offset + (a - seg.offset);
          for_each_overlap(saved.segments[src.file], from, from + (b - a), [&](const Piece& file, int64_t x, int64_t y) {
            const Read r{file.file, file.shard_offset + (x - file.offset), dst + (x - from), y - x};
            Read* last = reads.empty() ? nullptr : &reads.back();
            if (last && last->file == r.file && last->src + last->count == r.src && last->dst + last->count == r.dst)
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

// The saved shards' files, each checked to hold the three (numel) f32 tensors.
std::vector<io::SafetensorsFile> open_saved_files(const SavedLayout& saved, const fs::path& dir) {
  std::vector<io::SafetensorsFile> files;
  for (size_t f = 0; f < saved.files.size(); ++f) {
    files.push_back(io::SafetensorsFile::open((dir / saved.files[f]).string()));
    for (const char* name : {kMasterTensor, kAdamMTensor, kAdamVTensor}) {
      LOOM_REQUIRE(files.back().has(name), "checkpoint file '", files.back().path(), "' has no tensor '", name, "'");
      const io::TensorInfo& info = files.back().info(name);
      LOOM_REQUIRE(info.dtype == DType::f32 && info.shape == Shape({saved.numel[f]}), "checkpoint file '",
                   files.back().path(), "': tensor '", name, "' is not f32 (", saved.numel[f], ") as the manifest says");
    }
  }
  return files;
}

}  // namespace

int64_t load_checkpoint(Trainer& trainer, const std::string& step_dir) {
  require_no_pipeline(trainer, "load_checkpoint");
  const fs::path dir(step_dir);
  const std::string where = (dir / kCheckpointManifestFile).string();
  LOOM_REQUIRE(fs::is_directory(dir), "checkpoint '", step_dir, "' does not exist");
  LOOM_REQUIRE(fs::exists(where), "checkpoint manifest '", where, "' is missing: the checkpoint is incomplete");
  const nlohmann::json m = model::read_json_file(where);
  const auto version = manifest_value<int64_t>(m, "format_version", where);
  LOOM_REQUIRE(version >= 2 && version <= kCheckpointFormatVersion, where, ": format_version ", version,
               " is not supported: this loom reads format_version 2 to ", kCheckpointFormatVersion);
  LOOM_REQUIRE(m.contains("config") && m["config"].contains("model"), where, ": config.model is missing");
  check_same_model(m["config"]["model"], model::model_config_to_json(trainer.config().model), where);
  // dp, tp and the ZeRO stage may change on resume: the state is read by
  // global parameter ranges, whatever the shards.
  const json mesh = m.value("mesh", nlohmann::json::object());
  for (const char* axis : {"pp", "cp", "ep"})
    LOOM_REQUIRE(manifest_value<int64_t>(mesh, axis, where) == 1, where, ": mesh.", axis,
                 " is not 1: resharding a checkpoint over ", axis, " is not supported yet");
  SavedLayout saved;
  const auto saved_tp = manifest_value<int64_t>(mesh, "tp", where);
  const int64_t listed = m.value("shards", json::array()).size();
  LOOM_REQUIRE(saved_tp >= 1 && saved_tp <= listed && (version >= 3 || saved_tp == 1), where, ": mesh.tp = ",
               saved_tp, " is invalid: allowed are 1 to the ", listed, " shards", version < 3 ? " (1 in format 2)" : "");
  saved.tp = static_cast<int>(saved_tp);
  check_files(trainer, m.value("files", nlohmann::json()), dir, where);
  const auto step = manifest_value<int64_t>(m, "step", where);
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
  saved_specs(saved, trainer.config().model, m, version, where);
  saved_shards(saved, m, where);
  std::vector<io::SafetensorsFile> files = open_saved_files(saved, dir);
  // Everything is checked: read this rank's segments from whichever saved
  // shards hold them.
  parallel::DataParallel& dp = trainer.dp();
  std::vector<Piece> mine;
  for (const parallel::Segment& s : dp.segments()) mine.push_back({s.offset, s.count, s.shard_offset});
  sort_pieces(mine);
  int64_t padding = 0;
  const std::vector<Read> reads = plan_reads(trainer.model().param_specs(), mine, saved, padding);
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  const int64_t S = dp.shard_numel();
  OwnedTensor master = pool.zeros(DType::f32, {S}), adam_m = pool.zeros(DType::f32, {S}),
              adam_v = pool.zeros(DType::f32, {S});
  int64_t read = 0;
  for (const Read& r : reads) {
    files[r.file].read_range(kMasterTensor, r.src, Tensor(master).slice(0, r.dst, r.count));
    files[r.file].read_range(kAdamMTensor, r.src, Tensor(adam_m).slice(0, r.dst, r.count));
    files[r.file].read_range(kAdamVTensor, r.src, Tensor(adam_v).slice(0, r.dst, r.count));
    read += r.count;
  }
  LOOM_CHECK(read + padding == S, "load_checkpoint: read ", read, " + padding ", padding, " of the shard's ", S,
             " elements");
  warn_changed_keys(m["config"], run_config_to_json(trainer.config()), where);
  dp.load_state(master, adam_m, adam_v);
  trainer.set_steps_done(step);
  dp.set_steps_taken(updates);
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
