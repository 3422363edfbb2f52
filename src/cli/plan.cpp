// loom plan: what a training run will hold per rank and memory tag, before
// it runs (plan/memory_plan.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "plan/memory_plan.h"
#include "train/config.h"
#include "train/reports.h"

namespace loom::cli {
namespace {

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string out;
  bool json = false;
};

std::string mib(size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return s;
}

void run_plan(const PlanArgs& a) {
  const train::RunConfig cfg = train::load_run_config(a.config, a.overrides);
  // As loom train: the final model goes to --out, else checkpoint.dir.
  const plan::MemoryPlanOptions o{.writes_model = !a.out.empty() || !cfg.checkpoint.dir.empty()};
  for (const plan::RankMemory& r : plan::plan_memory(cfg, o)) {
    if (a.json) {
      std::printf("%s", train::memory_json_lines(r.at, r.bytes).c_str());
      continue;
    }
    std::printf("[rank %d: pp %d, dp %d, cp %d, tp %d, ep %d]\n%-12s%14s%14s\n", r.at.world_rank, r.at.pp_rank,
                r.at.dp_rank, r.at.cp_rank, r.at.tp_rank, r.at.ep_rank, "tag", "end MiB", "peak MiB");
    size_t states = 0;
    for (int i = 0; i < kNumMemTags; ++i) {
      const auto tag = static_cast<MemTag>(i);
      const TagUsage& u = r.bytes.tags[static_cast<size_t>(i)];
      std::printf("%-12s%14s%14s\n", std::string(mem_tag_name(tag)).c_str(), mib(u.current).c_str(),
                  mib(u.peak).c_str());
      if (tag == MemTag::params || tag == MemTag::grads || tag == MemTag::master || tag == MemTag::optimizer)
        states += u.peak;
    }
    std::printf("model states %s MiB; the ZeRO paper's mixed-precision Adam (16 psi, K = 12, as this stage divides it) "
                "%s MiB\nactivations per Korthikanti et al. (recompute none, no s x s scores) %s MiB\n",
                mib(states).c_str(), mib(static_cast<size_t>(r.textbook.model_states)).c_str(),
                mib(static_cast<size_t>(r.textbook.activations)).c_str());
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "predict the bytes every rank of a training run holds per memory tag, before it runs: the same figures "
              "`loom train --memory-json` measures (data parallelism with ZeRO 0 to 3, context and tensor parallelism, on the CPU)");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--config", a->config, "TOML run config, as loom train takes it")->required();
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", a->out, "the run writes its final model here (as loom train --out): counts the gather it "
                                   "takes");
  cmd->add_flag("--json", a->json, "one JSON line per rank and tag, as loom train --memory-json prints them");
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace loom::cli
