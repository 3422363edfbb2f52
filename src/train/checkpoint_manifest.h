// A checkpoint's manifest.json (train/checkpoint.h has the layout of a step
// dir and the manifest's keys): building it from a trainer, reading and
// checking it, and the SHA-256 digests of the files it lists. The checks of
// one rank only; the collective parts (every file digested once over the
// mesh) are train/checkpoint.cpp's.
//
//   const nlohmann::json m = read_manifest(step_dir);         // or IncompleteCheckpoint
//   const ManifestMesh mesh = check_manifest_mesh(m, model_json, where);
//   ... check_manifest_file(f, dir, where, digest) for each listed file ...
//   const ManifestState state = manifest_state(m, dir, where, scaler);
//   const SavedLayout saved = saved_layout(m, cfg, lora, mesh, where);  // checkpoint_reshard.h
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "parallel/dp.h"
#include "train/checkpoint_reshard.h"
#include "core/sha256.h"
#include "train/loss_scaler.h"
#include "train/trainer.h"

namespace loom::train {

inline constexpr int kCheckpointFormatVersion = 5;
inline constexpr const char* kCheckpointManifestFile = "manifest.json";

// One shard a rank saves: its piece (checkpoint_saved_segments) of one
// parameter group of one of its chunks. Every rank's are gathered for the
// manifest.
struct SavedShardRecord {
  int64_t stage = 0, first = 0, count = 0;  // the chunk's pipeline stage (c x pp + pp rank) and its layers
  int group = 0;                            // the chunk's DataParallel group
  int rank = 0;                             // the world rank whose file holds it
  int pp_rank = 0, dp_rank = 0, cp_rank = 0, ep_rank = 0, tp_rank = 0;
  std::vector<parallel::Segment> segments;  // in the group's space, packed
  int64_t numel() const;
};

// The prefix of chunk c's tensors of parameter group `group` in its rank's
// file: "" without pipelining (master, adam_m and adam_v, as in format 3),
// "chunk<c>." with it; then the group's name and a dot for any group but
// "dense" ("experts.master").
std::string checkpoint_tensor_prefix(int pp_size, int c, const std::string& group);

// What rank r of a chunk's dp group saves: its ZeRO-1 piece of every bucket,
// whatever the stage, so that the ranks of a stage-0 run (which all hold
// everything) each write 1/dp of the state and the shards cover the
// parameters exactly once.
std::vector<parallel::Segment> checkpoint_saved_segments(const std::vector<parallel::Bucket>& buckets, int zero_stage,
                                                         int dp_size, int r);

// The manifest of t's checkpoint at t.steps_done(): files (name, rank, bytes,
// sha256 per rank file) and every rank's shards (which give every pipeline
// stage's layers).
nlohmann::ordered_json manifest_json(Trainer& t, const nlohmann::ordered_json& files,
                                     const std::vector<SavedShardRecord>& shards);

// step_dir/manifest.json, parsed. A missing dir or manifest, or one that is
// not JSON, is an IncompleteCheckpoint (train/checkpoint_dir.h).
nlohmann::json read_manifest(const std::filesystem::path& step_dir);

// The manifest's format version and saved pp, tp and ep sizes.
struct ManifestMesh {
  int64_t version = 0;
  int pp = 1, tp = 1, ep = 1;
};
// Checks the format version, that config.model is run_model (the run's
// model/config_json.h form), and the pp, tp and ep sizes.
ManifestMesh check_manifest_mesh(const nlohmann::json& m, const nlohmann::json& run_model, const std::string& where);

// Presence and size (digest = false), or the sha256 too, of one file the
// manifest lists (f: its "files" entry) in dir.
void check_manifest_file(const nlohmann::ordered_json& f, const std::filesystem::path& dir, const std::string& where,
                         bool digest);

// The state a resume restores besides the tensors.
struct ManifestState {
  int64_t step = 0, position = 0, updates = 0;  // data.position, optimizer.steps_taken
  double loss_scale = 0;                        // fp16 runs (scaler given) only
  int64_t good_steps = 0;
};
// Checks and returns it: the step against the step dir's name (dir), the
// data position, the AdamW update count, and under fp16 (scaler: the run's)
// the loss scale, which scaler must accept.
ManifestState manifest_state(const nlohmann::json& m, const std::filesystem::path& dir, const std::string& where,
                             const DynamicLossScaler* scaler);

// How the saved run held the parameters (checkpoint_reshard.h), from the
// manifest's pipeline stages, parameters and shards, each checked against
// cfg's layout at the saved sizes (of its adapters when lora is enabled);
// the shards must cover each (stage, tp rank)'s parameters exactly once,
// from files the manifest lists.
SavedLayout saved_layout(const nlohmann::json& m, const model::ModelConfig& cfg, const model::LoraConfig& lora,
                         const ManifestMesh& mesh, const std::string& where);

// LoRA: what a checkpoint of adapters records of them and of their base
// (rank, alpha, targets, the base weights' SHA-256), and the check that a
// resume trains the same adapters on the same base: a checkpoint of a whole
// model resumed as adapters (or back), other adapters, or another base is a
// loom::Error naming both.
nlohmann::json lora_json(Trainer& t);
void check_same_lora(const nlohmann::json& m, Trainer& t, const std::string& where);

// Logs a warning for each train and data key that differs between the
// checkpoint's run and this one (allowed, but the continuation then differs
// from the uninterrupted run).
void warn_changed_keys(const nlohmann::ordered_json& saved_config, const nlohmann::ordered_json& run_config,
                       const std::string& where);

}  // namespace loom::train
