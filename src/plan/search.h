// loom plan's layout search, the three-step recipe of the Ultra-Scale
// Playbook (Tazi et al. 2025, "finding the best training configuration"):
// enumerate every layout loom can run a model with on a cluster — dp, tp,
// pp, cp, ep (a MoE model's), ZeRO stage, recompute policy, micro-batch and
// gradient accumulation, pipeline schedule and virtual stages —
//   1. drop those whose fullest rank does not fit a device's memory (the
//      memory plan: memory_plan.h, the layout itself),
//   2. keep those whose dp x micro-batch x grad_accum is the global batch,
//   3. rank the rest by predicted throughput (the step-time model:
//      time_plan.h),
// and say, family by family, why the others were dropped.
//
// The world is every device of the cluster; on a CPU cluster (shared
// cores) every rank count from 1 to its cores, as a run there may use
// fewer ranks with more threads each. tp stays within a node (a
// cross-node tp is dropped with that reason, as Megatron's guidance).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/config.h"
#include "plan/cluster.h"
#include "plan/time_plan.h"
#include "train/config.h"

namespace loom::plan {

struct SearchRequest {
  model::ModelConfig model;
  int64_t seq_len = 0;
  int64_t global_batch = 0;  // sequences per step
  std::string dtype = "bf16";
  Cluster cluster;
  int top = 10;  // how many layouts to keep
  int max_zero_stage = 3;  // the highest ZeRO stage to consider (a framework to compare with may offer fewer)
};

struct Choice {
  train::RunConfig cfg;
  StepTime time;
  double peak_bytes = 0;  // the fullest rank's peaks summed over its tags (an upper bound of its peak)
  int fullest_rank = 0;
  MemoryReport memory;    // the fullest rank's bytes per tag (memory_plan.h)
};

// A family of dropped layouts: why, how many, and one of them.
struct Rejected {
  std::string reason;
  int64_t count = 0;
  std::string example;
};

struct SearchResult {
  std::vector<Choice> best;         // fastest first
  std::vector<Rejected> rejected;   // most common reason first
  int64_t considered = 0, fitting = 0;
};

// A bad request (no global batch, a model the cluster's dtype cannot run)
// is a loom::Error saying what is allowed; a request no layout satisfies is
// a result with no best layouts and every family's reason.
SearchResult search_layouts(const SearchRequest& r);

// "dp 4 tp 2 pp 2 cp 1, ZeRO 1, recompute selective, mb 2 x ga 16, 1f1b"
std::string layout_name(const train::RunConfig& cfg);
// The result as loom plan prints it: the best layouts as a table (layout,
// memory, step time and its parts, tokens/s, MFU, the fullest rank's memory
// per tag), then the rejected families.
std::string search_table(const SearchResult& s, const SearchRequest& r);
// One JSON object per line: each best layout (with its fullest rank's
// peak_bytes_by_tag), then each rejected family.
std::string search_json(const SearchResult& s);

}  // namespace loom::plan
