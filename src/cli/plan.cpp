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

void run_plan(const PlanArgs& a) {
  const train::RunConfig cfg = train::load_run_config(a.config, a.overrides);
  // As loom train: the final model goes to --out, else checkpoint.dir.
  const plan::MemoryPlanOptions o{.writes_model = !a.out.empty() || !cfg.checkpoint.dir.empty()};
  for (const plan::RankMemory& r : plan::plan_memory(cfg, o))
    std::printf("%s", (a.json ? train::memory_json_lines(r.at, r.bytes) : plan::memory_plan_table(r)).c_str());
}

}  // namespace

void add_plan_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "predict the bytes every rank of a training run holds per memory tag, before it runs: the same figures "
              "`loom train --memory-json` measures (data parallelism with ZeRO 0 to 3, context, tensor and pipeline parallelism, on the CPU)");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--config", a->config, "TOML run config, as loom train takes it")->required();
  cmd->add_option("--set", a->overrides, "override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", a->out, "the run writes its final model here (as loom train --out): counts the gather it "
                                   "takes");
  cmd->add_flag("--json", a->json, "one JSON line per rank and tag, as loom train --memory-json prints them");
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace loom::cli
