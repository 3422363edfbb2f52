// Training checkpoints (DESIGN.md §7): one directory per step, with one
// safetensors file per rank and a manifest, written so that a crash at any
// point leaves the previous checkpoint usable.
//
//   checkpoint.dir/
//     latest                      "step_000010\n": the step dir saved last (a
//                                 hint: resume = auto checks the step dirs
//                                 themselves, train/checkpoint_dir.h)
//     loom.lock                   held by the run using the dir (core/dir_lock.h)
//     abandoned/                  step dirs of other timelines, set aside
//     step_000010/
//       rank_00000.safetensors    one per rank (pp rank, dp rank, cp rank,
//       rank_00001.safetensors    tp rank), named by its world rank (mesh
//                                 order, tp fastest): per chunk of the rank
//                                 and parameter group, master, adam_m,
//                                 adam_v, each the packed (S) f32 shard
//                                 (parallel/dp.h) of that group's parameters
//                                 of its tp rank (and ep rank) and pipeline
//                                 stage (tensor names prefixed chunk<c>.
//                                 under pipelining, and experts. for the
//                                 experts' group under ep; bare without)
//       manifest.json             written last (by pp, dp and tp rank 0):
//                                 format_version, step, config, mesh (dp, tp,
//                                 pp, cp, ep, zero_stage), pipeline
//                                 (virtual_stages; per stage first_layer,
//                                 n_layers, numel: one tp (and ep) rank's flat
//                                 elements), parameters (global_numel; per
//                                 tensor its stage, its group ("dense", or
//                                 "experts" with its ep_rank), its local
//                                 offset in its flat buffer and shape, its
//                                 global_shape and tp split [dim, blocks,
//                                 padded extent]: model/params.h; a later
//                                 stage's copy of a tied embedding is not
//                                 listed), shards (per rank, chunk and group:
//                                 rank, stage, group, tp, ep, dp and cp
//                                 ranks, file, tensor prefix, numel, segments
//                                 [offset, count, shard_offset] in the
//                                 group's space: train/checkpoint_reshard.h),
//                                 files (bytes, sha256), data, optimizer, lr
//
// Parameter groups: the dense parameters are averaged and sharded over dp x
// cp; under expert parallelism each ep rank's experts form a group of their
// own over the ranks holding them (expert-dp x cp), so a shard's segments
// are in its group's index space (the group's parameters packed in flat
// order), and each ep rank's experts are saved by its own ranks.
//
// Resharding: a checkpoint is read by parameter name and global ranges, so a
// run may resume under another pp size (or virtual_stages, or partition), tp
// size, dp size, cp size, ep size or ZeRO stage (saved at tp = 2, resumed at
// tp = 1 or tp = 4 x dp = 2 ZeRO-1; saved at pp = 2, resumed at pp = 1 or
// pp = 4; saved at ep = 2, resumed at ep = 1 or 4). Every saved space's
// layout is checkpoint_groups(model::param_specs(config.model, {tp, rank},
// {first_layer, n_layers}, {ep, ep rank})) of the saved config, so the
// manifest only records it to check it (train/checkpoint_manifest.h); each
// rank maps the global elements of its chunks' groups' parameters to the
// saved shards holding them (train/checkpoint_reshard.h) and reads only
// those of its own dp segments. Vocabulary padding rows are read as 0
// (weights and moments). Every rank writes its own file and reads from a
// shared filesystem (one machine, or a shared checkpoint.dir). Format 4
// (before ep) and 3 (before pp) read as ep = 1 (3 as pp = 1 too), format 2
// (before tp) as tp = 1 too.
//
// A step dir is written as step_NNNNNN.tmp (every file fsynced, the
// manifest last), then renamed into place; `latest` is updated after that,
// and older step dirs are deleted (checkpoint.keep) only after that too. So
// a step dir is always complete, and a crash at any point leaves every
// complete checkpoint there was, or the new one in its place.
//
// A resume restores everything the next step depends on: parameters, AdamW
// moments and update count (hence the LR, a function of it), and the train
// data position; the val batches and the init seed hold no state. N steps
// equal k steps + save + load + (N - k) steps bitwise (under the same dp,
// tp and pp sizes and stage; another layout continues with the same losses up
// to the reduction order's rounding).
//
// save_checkpoint and load_checkpoint are collective over the trainer's mesh.
//
//   const std::string dir = resume_checkpoint(trainer, cfg.checkpoint);  // checkpoint_dir.h; "" = fresh
//   ...
//   save_checkpoint(trainer, cfg.checkpoint.dir, cfg.checkpoint.keep);
#pragma once

#include <cstdint>
#include <string>

#include "train/checkpoint_manifest.h"  // kCheckpointFormatVersion, kCheckpointManifestFile, Sha256, sha256_hex
#include "train/config.h"
#include "train/trainer.h"

namespace loom::train {

inline constexpr const char* kCheckpointLatestFile = "latest";

std::string checkpoint_step_dir_name(int64_t step);  // step_000010
std::string checkpoint_rank_file_name(int rank);     // rank_00000.safetensors (rank: the world rank)

// Writes root/step_NNNNNN for trainer.steps_done() (through
// step_NNNNNN.tmp; replacing one of that name), points root/latest at it,
// then deletes all but the newest `keep` step dirs (keep = 0: none), never
// `protect`. Returns the step dir's path.
std::string save_checkpoint(Trainer& trainer, const std::string& root, int64_t keep, const std::string& protect = "");

// Checks the whole checkpoint first (manifest format version, the model
// config against the trainer's, every listed file's presence, size and
// sha256 (each file digested by one rank), every tensor's shape), then
// restores the trainer's state. Any problem is a loom::Error naming the file
// and what is wrong, thrown on every rank before the trainer or any file is
// touched; a checkpoint that is not complete (manifest or files missing,
// truncated, corrupt) throws IncompleteCheckpoint (checkpoint_dir.h), and a
// manifest whose step differs from its step dir's name is an error. Returns
// the restored step.
int64_t load_checkpoint(Trainer& trainer, const std::string& step_dir);

}  // namespace loom::train
