#include "train/checkpoint.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/host_values.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "core/staged_dir.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/config_json.h"
#include "parallel/dp.h"
#include "train/checkpoint_dir.h"
#include "train/checkpoint_reshard.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Tensors of a rank file: the rank's packed shard (parallel/dp.h segments)
// of the f32 master weights and of the two AdamW moments.
constexpr const char* kMasterTensor = "master";
constexpr const char* kAdamMTensor = "adam_m";
constexpr const char* kAdamVTensor = "adam_v";

// This rank's file: named by its world rank (the manifest's file_rank).
int file_rank(Trainer& t) { return t.mesh().world_rank(); }

void barrier(Trainer& t) { t.mesh().world().barrier()->wait(); }

void all_gather_i64(comm::Communicator& g, std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  comm::all_gather_host(g, Tensor(out.data(), DType::i64, {static_cast<int64_t>(out.size())}),
                        Tensor(const_cast<int64_t*>(in.data()), DType::i64, {static_cast<int64_t>(in.size())}));
}

// Every rank's `record` (n i64 each), in file rank order: the world's rank
// order. Collective over the mesh.
std::vector<int64_t> gather_records(Trainer& t, const std::vector<int64_t>& record) {
  std::vector<int64_t> all(record.size() * static_cast<size_t>(t.mesh().world_size()));
  all_gather_i64(t.mesh().world(), all, record);
  return all;
}

// The shards this rank saves: per chunk and parameter group (one with
// parameters) its checkpoint_saved_segments, whatever the ZeRO stage.
std::vector<SavedShardRecord> my_shards(Trainer& t) {
  const mesh::Coord& at = t.mesh().coord();
  std::vector<SavedShardRecord> out;
  for (int c = 0; c < t.num_chunks(); ++c) {
    const parallel::DataParallel& dp = t.chunk_dp(c);
    for (int g = 0; g < dp.num_groups(); ++g) {
      const parallel::GroupLayout& l = dp.group(g);
      if (l.space.numel == 0) continue;  // a stage without experts
      comm::Communicator& comm = l.comm;
      out.push_back({.stage = static_cast<int64_t>(c) * t.pp_size() + t.pp_rank(),
                     .first = t.chunk(c).first_layer(),
                     .count = t.chunk(c).num_layers(),
                     .group = g,
                     .rank = file_rank(t),
                     .pp_rank = at.pp, .dp_rank = at.dp, .cp_rank = at.cp, .ep_rank = t.mesh().ep().rank(),
                     .tp_rank = at.tp,
                     .segments = checkpoint_saved_segments(l.buckets, dp.options().zero_stage, comm.size(),
                                                           comm.rank())});
    }
  }
  return out;
}

// Every rank's shards, world rank order: records of i64s, padded to the
// longest. Collective over the mesh.
std::vector<SavedShardRecord> gather_shards(Trainer& t, const std::vector<SavedShardRecord>& mine) {
  constexpr int kHead = 11;  // stage, first, count, group, rank, pp, dp, cp, ep, tp ranks, segments
  std::vector<int64_t> rec{static_cast<int64_t>(mine.size())};
  for (const SavedShardRecord& r : mine) {
    rec.insert(rec.end(), {r.stage, r.first, r.count, r.group, r.rank, r.pp_rank, r.dp_rank, r.cp_rank, r.ep_rank,
                           r.tp_rank, static_cast<int64_t>(r.segments.size())});
    for (const parallel::Segment& g : r.segments) rec.insert(rec.end(), {g.offset, g.count, g.shard_offset});
  }
  const std::vector<int64_t> widths = gather_records(t, {static_cast<int64_t>(rec.size())});
  const size_t width = static_cast<size_t>(*std::max_element(widths.begin(), widths.end()));
  rec.resize(width, 0);
  const std::vector<int64_t> all = gather_records(t, rec);
  std::vector<SavedShardRecord> out;
  for (size_t rank = 0; rank < widths.size(); ++rank) {
    const int64_t* p = &all[rank * width];
    for (int64_t n = *p++, i = 0; i < n; ++i, p += kHead) {
      SavedShardRecord r{p[0], p[1], p[2], static_cast<int>(p[3]), static_cast<int>(p[4]), static_cast<int>(p[5]),
                         static_cast<int>(p[6]), static_cast<int>(p[7]), static_cast<int>(p[8]),
                         static_cast<int>(p[9]), {}};
      for (int64_t k = 0; k < p[10]; ++k) r.segments.push_back({p[kHead + 3 * k], p[kHead + 3 * k + 1], p[kHead + 3 * k + 2]});
      p += 3 * p[10];
      out.push_back(std::move(r));
    }
  }
  return out;
}

// Publishes the complete tmp dir as dir. A dir of that name already there
// (an earlier run's, set aside otherwise: checkpoint_dir.h) is replaced:
// exchanged with tmp (core/staged_dir.h), or, where the file system cannot,
// moved to dir.old first, so that a crash in between leaves one of the two;
// the leftover (step_*.tmp, step_*.old) goes at the next run's first save.
void publish_step_dir(const fs::path& tmp, const fs::path& dir) {
  publish_dir(tmp.string(), dir.string(), dir.string() + ".old");
}

// Every file the manifest lists. Collective over the mesh: each rank checks
// every file's presence and size, but digests only its share (file i on world
// rank i mod the world size), so the files are read once in all; then the first bad
// file's check is repeated by every rank, so that all throw the same error.
void check_files(Trainer& t, const json& files, const fs::path& dir, const std::string& where) {
  LOOM_REQUIRE(files.is_array() && !files.empty(), where, ": 'files' is missing or empty");
  for (const json& f : files) check_manifest_file(f, dir, where, false);
  const int64_t n = static_cast<int64_t>(files.size()), ranks = t.mesh().world_size();
  int64_t first_bad = n;
  for (int64_t i = file_rank(t); i < n && first_bad == n; i += ranks) {
    try {
      check_manifest_file(files[i], dir, where, true);
    } catch (const Error&) {
      first_bad = i;
    }
  }
  const std::vector<int64_t> all = gather_records(t, {first_bad});
  first_bad = *std::min_element(all.begin(), all.end());
  if (first_bad == n) return;
  check_manifest_file(files[first_bad], dir, where, true);
  fail("checkpoint file '", (dir / files[first_bad].value("name", "")).string(),
       "' failed its sha256 check on another rank but not on this one: is checkpoint.dir shared by every rank?");
}

// Creates root/<name>.tmp afresh (the lead's part of a save).
void create_tmp_dir(const fs::path& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_REQUIRE(!ec, "cannot create the checkpoint directory '", tmp.string(), "': ", ec.message());
}

// The tensors of a rank's file, by name, and the memory that holds them.
struct RankTensors {
  std::vector<std::pair<std::string, Tensor>> named;
  std::vector<OwnedTensor> owned;
  // State on disk (parallel.offload): read part by part as the file is written.
  std::vector<io::StreamedTensor> streamed;
};

// The bytes a checkpoint of state on disk goes through at a time.
constexpr int64_t kStreamedSaveBytes = int64_t{4} << 20;

// A shard's tensors read from disk part by part as they are written (an
// offloaded run's state does not fit in memory at once): elements of the
// saved piece map to the live shard as in add_shard_tensors.
void add_streamed_shard_tensors(const parallel::DataParallel& cdp, const SavedShardRecord& r,
                                const std::string& prefix, RankTensors& out) {
  const int g = r.group;
  const std::vector<parallel::Segment> to = r.segments, from = cdp.group(g).segments;
  for (int k = 0; k < 3; ++k) {  // master, m, v
    const auto fill = [&cdp, g, to, from, k](int64_t first, Tensor part) {
      const int64_t end = first + part.numel();
      for (size_t b = 0; b < to.size(); ++b) {  // one segment per bucket in both lists
        const int64_t lo = std::max(first, to[b].shard_offset), hi = std::min(end, to[b].shard_offset + to[b].count);
        if (lo >= hi) continue;
        const int64_t at = from[b].shard_offset + (to[b].offset - from[b].offset) + (lo - to[b].shard_offset);
        const Tensor dst = part.slice(0, lo - first, hi - lo);
        if (k == 0) cdp.pack_master(g, dst, at);
        else cdp.read_optimizer_state(g, k - 1, dst, at);
      }
    };
    const char* name = k == 0 ? kMasterTensor : k == 1 ? kAdamMTensor : kAdamVTensor;
    out.streamed.push_back({prefix + name, DType::f32, Shape({r.numel()}), fill});
  }
}

// Adds the tensors of one shard a rank writes (one parameter group of one
// chunk): its piece (checkpoint_saved_segments) of the master weights and of
// the AdamW moments, copied out of the state it holds (the same segments
// from stage 1 on; under stage 0 a slice of the whole). State on disk:
// add_streamed_shard_tensors.
void add_shard_tensors(const parallel::DataParallel& cdp, const SavedShardRecord& r, const AdamW& opt,
                       const std::string& prefix, Pool& pool, RankTensors& out) {
  const int g = r.group;
  const parallel::GroupLayout& l = cdp.group(g);
  OwnedTensor held = pool.empty(DType::f32, {l.shard_numel});
  cdp.pack_master(g, held);
  // The moments in host memory: read back once for this shard from a device.
  OwnedTensor host_m, host_v;
  Tensor opt_m, opt_v;
  if (opt.m(g).device().is_cpu()) {
    opt_m = opt.m(g), opt_v = opt.v(g);
  } else {
    host_m = pool.empty(DType::f32, {l.shard_numel}), host_v = pool.empty(DType::f32, {l.shard_numel});
    opt.read_moments(g, host_m, host_v);
    opt_m = host_m, opt_v = host_v;
  }
  const std::vector<parallel::Segment>& pieces = r.segments;
  const int64_t numel = r.numel();
  OwnedTensor master = pool.empty(DType::f32, {numel}), adam_m = pool.empty(DType::f32, {numel}),
              adam_v = pool.empty(DType::f32, {numel});
  for (size_t b = 0; b < pieces.size(); ++b) {  // one segment per bucket in both lists
    const parallel::Segment &to = pieces[b], &from = l.segments[b];
    const int64_t at = from.shard_offset + (to.offset - from.offset);
    kernels::cast(Tensor(master).slice(0, to.shard_offset, to.count), Tensor(held).slice(0, at, to.count));
    kernels::cast(Tensor(adam_m).slice(0, to.shard_offset, to.count), opt_m.slice(0, at, to.count));
    kernels::cast(Tensor(adam_v).slice(0, to.shard_offset, to.count), opt_v.slice(0, at, to.count));
  }
  out.named.emplace_back(prefix + kMasterTensor, Tensor(master));
  out.named.emplace_back(prefix + kAdamMTensor, Tensor(adam_m));
  out.named.emplace_back(prefix + kAdamVTensor, Tensor(adam_v));
  out.owned.push_back(std::move(master)), out.owned.push_back(std::move(adam_m)), out.owned.push_back(std::move(adam_v));
}

// Writes this rank's file into tmp: every shard's tensors. Returns its path.
fs::path write_rank_file(Trainer& trainer, const std::vector<SavedShardRecord>& shards, const fs::path& tmp) {
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  RankTensors tensors;
  const int pp = trainer.pp_size();
  for (const SavedShardRecord& r : shards) {
    const int c = static_cast<int>(r.stage) / pp;
    const parallel::DataParallel& dp = trainer.chunk_dp(c);
    const std::string prefix = checkpoint_tensor_prefix(pp, c, dp.group(r.group).name);
    if (dp.state_on_disk()) add_streamed_shard_tensors(dp, r, prefix, tensors);
    else add_shard_tensors(dp, r, trainer.chunk_optimizer(c), prefix, pool, tensors);
  }
  const int rank = file_rank(trainer);
  const fs::path rank_path = tmp / checkpoint_rank_file_name(rank);
  std::map<std::string, std::string> metadata{{"format", "loom-checkpoint"},
                                              {"step", std::to_string(trainer.steps_done())},
                                              {"rank", std::to_string(rank)},
                                              {"dp_rank", std::to_string(trainer.mesh().dp().rank())},
                                              {"cp_rank", std::to_string(trainer.mesh().cp().rank())},
                                              {"tp_rank", std::to_string(trainer.tp_rank())}};
  if (trainer.pp_size() > 1) metadata["pp_rank"] = std::to_string(trainer.pp_rank());
  if (trainer.mesh().shape().ep > 1) metadata["ep_rank"] = std::to_string(trainer.mesh().ep().rank());
  if (tensors.streamed.empty()) {
    io::write_safetensors(rank_path.string(), tensors.named, metadata);
    return rank_path;
  }
  for (const auto& [name, t] : tensors.named) {  // the tensors in memory go the same way
    const Tensor whole = t;
    tensors.streamed.push_back({name, t.dtype(), t.shape(), [whole](int64_t first, Tensor part) {
                                  const size_t elem = dtype_size(whole.dtype());
                                  std::memcpy(part.data(), static_cast<const char*>(whole.data()) + first * elem,
                                              part.nbytes());
                                }});
  }
  io::write_safetensors(rank_path.string(), tensors.streamed, metadata, kStreamedSaveBytes);
  return rank_path;
}

// Each rank digests its own file; the lead lists them all: (bytes, sha256
// as 64 hex characters) per rank.
constexpr int kRecord = 9;

std::vector<int64_t> file_record(const fs::path& rank_path) {
  std::vector<int64_t> mine(kRecord);
  mine[0] = static_cast<int64_t>(fs::file_size(rank_path));
  const std::string sha = sha256_file_hex(rank_path.string());
  std::memcpy(&mine[1], sha.data(), 64);
  return mine;
}

// The manifest's "files": every rank's file from its gathered record.
json files_json(Trainer& trainer, const std::vector<int64_t>& all) {
  json files = json::array();
  for (int r = 0; r < trainer.mesh().world_size(); ++r) {
    const int64_t* rec = &all[static_cast<size_t>(r) * kRecord];
    files.push_back({{"name", checkpoint_rank_file_name(r)},
                     {"rank", r},
                     {"bytes", rec[0]},
                     {"sha256", std::string(reinterpret_cast<const char*>(rec + 1), 64)}});
  }
  return files;
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

// One parameter group's packed shard of the saved state: master, adam_m, adam_v.
using GroupState = std::array<OwnedTensor, 3>;

// Group g of chunk c's packed shard of the saved state, read from whichever
// saved shards hold its segments (checkpoint_reshard.h).
GroupState read_group_state(Trainer& trainer, int c, int g, const SavedLayout& saved,
                            std::vector<io::SafetensorsFile>& files, Pool& pool) {
  const parallel::GroupLayout& l = trainer.chunk_dp(c).group(g);
  const ReadPlan plan = plan_reads(l.space.specs, l.segments, saved);
  const int64_t S = l.shard_numel;
  GroupState st{pool.zeros(DType::f32, {S}), pool.zeros(DType::f32, {S}), pool.zeros(DType::f32, {S})};
  int64_t read = 0;
  for (const Read& r : plan.reads) {
    const SavedLayout::Shard& shard = saved.shards[r.shard];
    io::SafetensorsFile& file = files[shard.open];
    file.read_range(shard.prefix + kMasterTensor, r.src, Tensor(st[0]).slice(0, r.dst, r.count));
    file.read_range(shard.prefix + kAdamMTensor, r.src, Tensor(st[1]).slice(0, r.dst, r.count));
    file.read_range(shard.prefix + kAdamVTensor, r.src, Tensor(st[2]).slice(0, r.dst, r.count));
    read += r.count;
  }
  LOOM_CHECK(read + plan.padding == S, "load_checkpoint: read ", read, " + padding ", plan.padding, " of chunk ", c,
             " group ", l.name, "'s shard of ", S, " elements");
  return st;
}

// Chunk c's state on disk (parallel.offload) from the saved shards, an
// extent at a time as DataParallel::load_state_streamed asks for it: the
// state of an offloaded run does not fit in memory at once. The reads are
// planned first (what can fail before anything changes).
void load_streamed_state(Trainer& trainer, int c, const SavedLayout& saved, std::vector<io::SafetensorsFile>& files) {
  parallel::DataParallel& dp = trainer.chunk_dp(c);
  std::vector<std::vector<Read>> plans;  // per group, by dst
  for (int g = 0; g < dp.num_groups(); ++g) {
    const parallel::GroupLayout& l = dp.group(g);
    plans.push_back(plan_reads(l.space.specs, l.segments, saved).reads);
    std::sort(plans.back().begin(), plans.back().end(), [](const Read& a, const Read& b) { return a.dst < b.dst; });
  }
  const char* tensors[3] = {kMasterTensor, kAdamMTensor, kAdamVTensor};
  dp.load_state_streamed([&](int g, int64_t at, std::span<const Tensor> parts) {
    LOOM_CHECK(parts.size() == 3, "load_checkpoint: ", parts.size(), " state arrays; AdamW keeps 3");
    const int64_t n = parts[0].numel(), end = at + n;
    for (const Tensor& p : parts) kernels::fill(p, 0.f);  // vocabulary padding: 0
    const std::vector<Read>& reads = plans[static_cast<size_t>(g)];
    auto it = std::partition_point(reads.begin(), reads.end(), [&](const Read& r) { return r.dst + r.count <= at; });
    for (; it != reads.end() && it->dst < end; ++it) {
      const int64_t lo = std::max(at, it->dst), hi = std::min(end, it->dst + it->count);
      if (lo >= hi) continue;
      const SavedLayout::Shard& shard = saved.shards[it->shard];
      for (int k = 0; k < 3; ++k)
        files[shard.open].read_range(shard.prefix + tensors[k], it->src + (lo - it->dst),
                                     parts[static_cast<size_t>(k)].slice(0, lo - at, hi - lo));
    }
  });
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
  const bool lead = trainer.dp().rank() == 0 && trainer.tp_rank() == 0 && trainer.pp_rank() == 0;
  const std::string name = checkpoint_step_dir_name(trainer.steps_done());
  // Written as name.tmp and renamed into place once complete, so that a
  // step dir is always a complete checkpoint (checkpoint_dir.h).
  const fs::path dir = fs::path(root) / name, tmp = fs::path(root) / (name + ".tmp");
  if (lead) create_tmp_dir(tmp);
  barrier(trainer);
  const std::vector<SavedShardRecord> mine = my_shards(trainer);
  const std::vector<SavedShardRecord> shards = gather_shards(trainer, mine);
  const fs::path rank_path = write_rank_file(trainer, mine, tmp);
  const std::vector<int64_t> all = gather_records(trainer, file_record(rank_path));
  if (lead) {
    write_file_atomic((tmp / kCheckpointManifestFile).string(),
                      manifest_json(trainer, files_json(trainer, all), shards).dump(2) + "\n");
    publish_step_dir(tmp, dir);
    write_file_atomic((fs::path(root) / kCheckpointLatestFile).string(), name + "\n");
    prune_step_dirs(root, keep, protect);
  }
  barrier(trainer);  // nobody resumes or reads before the manifest is there
  return dir.string();
}

namespace {

// data.train is not compared by spelling (a glob, a path moved): the saved
// loader's window count tells another data set (or seq_len) apart, whose
// sample order the saved position does not continue.
void warn_changed_data(const nlohmann::json& m, int64_t windows_per_epoch, const std::string& where) {
  const nlohmann::json data = m.value("data", nlohmann::json::object());
  if (!data.contains("windows_per_epoch") || data["windows_per_epoch"] == windows_per_epoch) return;
  log_warn("resuming on training data of ", windows_per_epoch, " windows an epoch, but ", where, " was written ",
           "reading ", data["windows_per_epoch"].dump(), " (from ", data.value("shards", nlohmann::json()).dump(),
           "): data.train or train.seq_len changed, so the run does not go on with the samples the saved run ",
           "would have read next");
}

}  // namespace

int64_t load_checkpoint(Trainer& trainer, const std::string& step_dir) {
  const fs::path dir(step_dir);
  const std::string where = (dir / kCheckpointManifestFile).string();
  const nlohmann::json m = read_manifest(dir);
  const ManifestMesh mesh = check_manifest_mesh(m, model::model_config_to_json(trainer.config().model), where);
  try {
    check_files(trainer, m.value("files", nlohmann::json()), dir, where);
  } catch (const IncompleteCheckpoint&) {
    throw;
  } catch (const Error& e) {
    throw IncompleteCheckpoint(e.what());
  }
  DynamicLossScaler* scaler = trainer.loss_scaler();
  const ManifestState state = manifest_state(m, dir, where, scaler);
  check_same_lora(m, trainer, where);
  const SavedLayout saved = saved_layout(m, trainer.config().model, trainer.config().lora.adapters, mesh, where);
  std::vector<io::SafetensorsFile> files = open_saved_files(saved, dir);
  // Everything is checked: read each chunk's segments from whichever saved
  // shards hold them, all before the trainer changes.
  MemoryTracker tracker;
  Pool pool(MemTag::workspace, Device::cpu(), tracker);
  // A chunk with its state on disk reads it as it loads it (below).
  std::vector<std::vector<GroupState>> chunks(trainer.num_chunks());  // [chunk][group]
  for (int c = 0; c < trainer.num_chunks(); ++c)
    for (int g = 0; g < trainer.chunk_dp(c).num_groups() && !trainer.chunk_dp(c).state_on_disk(); ++g)
      chunks[c].push_back(read_group_state(trainer, c, g, saved, files, pool));
  warn_changed_keys(m["config"], run_config_to_json(trainer.config()), where);
  warn_changed_data(m, trainer.train_data().windows_per_epoch(), where);
  for (int c = 0; c < trainer.num_chunks(); ++c) {
    if (trainer.chunk_dp(c).state_on_disk()) {
      load_streamed_state(trainer, c, saved, files);
      trainer.chunk_optimizer(c).set_steps_taken(state.updates);
      continue;
    }
    std::vector<Tensor> masters;
    for (int g = 0; g < trainer.chunk_dp(c).num_groups(); ++g) {
      masters.push_back(chunks[c][g][0]);
      trainer.chunk_optimizer(c).load_moments(g, chunks[c][g][1], chunks[c][g][2]);
    }
    trainer.chunk_dp(c).load_master(masters);
    trainer.chunk_optimizer(c).set_steps_taken(state.updates);
  }
  trainer.set_steps_done(state.step);
  if (scaler) scaler->restore(state.loss_scale, state.good_steps);
  trainer.train_data().set_position(state.position);
  return state.step;
}

}  // namespace loom::train
