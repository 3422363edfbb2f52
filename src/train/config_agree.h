// Under mpirun every rank reads its own --config and --set flags: before the
// run starts the ranks check that they resolved the same run config, so a
// mismatch is one message naming the keys and ranks instead of raw MPI
// errors (different shapes) or replicas that silently diverge (a different
// lr on one rank).
//
//   nlohmann::ordered_json run = agreed_run_config(cfg);
//   require_same_run_config(*world, run);   // every rank, before the mesh
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "train/config.h"

namespace loom::train {

// What must match on every rank: run_config_to_json(c) without [log], whose
// keys name per-rank outputs (a rank may write its own trace) and change no
// numbers. A caller may add other options that change the run.
nlohmann::ordered_json agreed_run_config(const RunConfig& c);

// Pure: "" when every rank's config equals rank 0's; else one line naming, for
// each rank that differs, every key (section.key) with both values, e.g.
// "rank 1's run config differs from rank 0's: train.lr = 0.2 on rank 1, 0.1
// on rank 0; ...".
std::string run_config_differences(const std::vector<nlohmann::ordered_json>& per_rank);

// Collective over comm: the ranks exchange a 64-bit digest of `run` (and the
// whole configs only when the digests differ). A difference throws
// comm::CollectiveError with run_config_differences' message on every rank,
// so all of them stop together before any other communication.
void require_same_run_config(comm::Communicator& comm, const nlohmann::ordered_json& run);

}  // namespace loom::train
