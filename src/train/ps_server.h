// Parameter-server training, the servers' side (DESIGN.md §5 PS; the
// protocol and the workers' side: parallel/ps.h).
//
// A summation server holds nothing between steps: per bucket it adds the
// workers' pieces in worker order and sends the sum back. An optimizer
// server holds its shard of the weights, the gradients and AdamW's moments
// and nothing else: the servers together are a ZeRO-3 data-parallel group
// of ps_servers ranks (a Trainer over their own mesh, which never runs
// forward or backward; its buckets, one per model unit, are the workers'
// buckets under optimizer servers: rank_chunks.cpp), so their checkpoints
// are ordinary checkpoints of that layout: collective data parallelism
// resumes them under any layout, and servers resume any checkpoint.
#pragma once

#include "comm/communicator.h"
#include "core/memory.h"
#include "train/config.h"

namespace loom::train {

// Serves the run `cfg` (parallel.mode = ps) as server servers.rank() until
// every worker says stop. world: the whole job (ranks 0..ps_servers-1 the
// servers, the rest the workers); servers: the servers alone. A worker
// whose hello disagrees with the run (another kind, worker count or bucket
// layout) is a loom::Error naming it.
void run_ps_server(const RunConfig& cfg, comm::Communicator& world, comm::Communicator& servers, Pools& pools);

// The config an optimizer server's Trainer runs: the workers' run as a
// ZeRO-3 data-parallel group of ps_servers ranks, without evaluation.
RunConfig ps_server_config(const RunConfig& cfg);

}  // namespace loom::train
