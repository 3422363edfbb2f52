#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "mesh/layout.h"
#include "plan/memory_plan.h"

namespace loom::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kRecompute[] = {"none", "selective", "full"};

// Faster first — throughputs within the same 0.5 % band count as equal, as
// the model cannot tell them apart — and between equals the simpler layout:
// less ZeRO sharding, less recompute, less pipeline, tensor, context and
// expert parallelism, then fewer and larger micro-batches.
bool better(const Choice& a, const Choice& b) {
  const auto band = [](double tokens_per_second) { return std::floor(std::log(tokens_per_second) / std::log(1.005)); };
  const auto rank = [&band](const Choice& c) {
    const std::string& r = c.cfg.train.recompute;
    const train::ParallelConfig& p = c.cfg.parallel;
    return std::tuple(-band(c.time.tokens_per_second), p.zero_stage, r == "none" ? 0 : r == "selective" ? 1 : 2, p.pp,
                      p.tp, p.cp, p.ep, c.cfg.train.grad_accum, -c.time.tokens_per_second);
  };
  return rank(a) < rank(b);
}

// A family of rejections: the reason with its numbers taken out ("parallel.cp
// = 2 ..." and "= 4 ..." are one family) and what follows ": it predicts".
std::string family_of(const std::string& reason) {
  std::string out;
  for (char c : reason.substr(0, reason.find(": it predicts")))
    if (!(c >= '0' && c <= '9') || out.empty() || out.back() != '#') out += c >= '0' && c <= '9' ? '#' : c;
  return out;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The pipeline schedules a layout of pp ranks and m micro-batches can use:
// (name, virtual stages).
std::vector<std::pair<std::string, int64_t>> schedules(int64_t pp, int64_t m, int64_t n_layer) {
  if (pp == 1) return {{"1f1b", 1}};
  std::vector<std::pair<std::string, int64_t>> out = {{"1f1b", 1}, {"afab", 1}};
  for (int64_t v : {2, 4})
    if (m % pp == 0 && pp * v <= n_layer) out.push_back({"interleaved", v});
  return out;
}

class Search {
 public:
  explicit Search(const SearchRequest& r) : r_(r) {}

  SearchResult run() {
    const Cluster& c = r_.cluster;
    std::vector<int64_t> worlds;  // a CPU's ranks may be fewer than its cores, each with more threads
    if (!c.shared_cores) worlds.push_back(c.devices());
    for (int64_t w = 1; c.shared_cores && w <= c.devices(); ++w) worlds.push_back(w);
    for (int64_t world : worlds)
      for (int64_t tp : divisors(world))
        for (int64_t pp : divisors(world / tp))
          for (int64_t cp : divisors(world / (tp * pp))) mesh(tp, pp, cp, world / (tp * pp * cp));
    std::sort(result_.best.begin(), result_.best.end(), better);
    if (static_cast<int>(result_.best.size()) > r_.top) result_.best.resize(static_cast<size_t>(r_.top));
    for (auto& [reason, rej] : rejected_) result_.rejected.push_back(rej);
    std::sort(result_.rejected.begin(), result_.rejected.end(),
              [](const Rejected& a, const Rejected& b) { return a.count > b.count; });
    return result_;
  }

 private:
  void reject(const std::string& reason, const std::string& example, int64_t count = 1) {
    Rejected& r = rejected_[family_of(reason)];
    if (r.count == 0) r.reason = reason.substr(0, reason.find(": it predicts")), r.example = example;
    r.count += count;
    result_.considered += count;
  }

  // Every layout of one mesh: expert parallelism (a MoE model's: ep
  // dividing dp and the experts), micro-batch and grad_accum, ZeRO,
  // recompute, schedule.
  void mesh(int64_t tp, int64_t pp, int64_t cp, int64_t dp) {
    const std::string name = concat("dp ", dp, " tp ", tp, " pp ", pp, " cp ", cp);
    if (!r_.cluster.shared_cores && tp > r_.cluster.devices_per_node)
      return reject(concat("tp > ", r_.cluster.devices_per_node, " crosses nodes (its collectives would leave NVLink)"),
                    name);
    if (r_.global_batch % dp != 0)
      return reject(concat("dp does not divide the global batch of ", r_.global_batch, " sequences"), name);
    const int64_t per_dp = r_.global_batch / dp;
    for (int64_t ep : divisors(dp))
      if (ep == 1 || (r_.model.is_moe() && r_.model.n_expert % ep == 0)) layouts(tp, pp, cp, dp, ep, per_dp);
  }

  void layouts(int64_t tp, int64_t pp, int64_t cp, int64_t dp, int64_t ep, int64_t per_dp) {
    for (int64_t mb : divisors(per_dp))
      for (int64_t zero = 0; zero <= (dp * cp > 1 ? std::min(pp > 1 ? 1 : 3, r_.max_zero_stage) : 0); ++zero)
        for (const char* recompute : kRecompute)
          for (const auto& [schedule, v] : schedules(pp, per_dp / mb, r_.model.n_layer)) {
            train::RunConfig cfg = base();
            train::ParallelConfig& p = cfg.parallel;
            p.dp = dp, p.tp = tp, p.pp = pp, p.cp = cp, p.ep = ep, p.zero_stage = zero, p.sequence_parallel = tp > 1;
            p.pp_schedule = schedule, p.virtual_stages = v;
            cfg.train.micro_batch = mb, cfg.train.grad_accum = per_dp / mb, cfg.train.recompute = recompute;
            consider(cfg);
          }
  }

  train::RunConfig base() const {
    train::RunConfig cfg;
    cfg.model = r_.model;
    cfg.data.train = {"(loom plan search)"};
    cfg.train.eval_every = 0;
    cfg.train.seq_len = r_.seq_len;
    cfg.train.dtype = r_.dtype;
    return cfg;
  }

  // Step 1 and 3 for one layout (step 2 holds by construction).
  void consider(const train::RunConfig& cfg) {
    const std::string name = layout_name(cfg);
    Choice choice;
    choice.cfg = cfg;
    try {
      train::validate_run_config(cfg, "layout");
      const train::ParallelConfig& p = cfg.parallel;
      const mesh::Layout layout(train::mesh_shape(p), static_cast<int>(p.dp * p.tp * p.pp * p.cp));
      for (int64_t s = 0; s < p.pp; ++s) {  // dp, cp, tp rank 0 of each stage: the fullest of its stage's ranks
        const int rank = layout.rank_of({.pp = static_cast<int>(s)});
        const RankMemory m = plan_memory_rank(cfg, rank);
        double sum = 0;
        for (const TagUsage& u : m.bytes.tags) sum += static_cast<double>(u.peak);
        if (sum > choice.peak_bytes) choice.peak_bytes = sum, choice.fullest_rank = rank, choice.memory = m.bytes;
        if (sum > r_.cluster.memory_bytes) return reject("does not fit a device's memory", name);
      }
      choice.time = predict_step_time(cfg, r_.cluster);
    } catch (const Error& e) {
      std::string why = e.what();
      if (why.rfind("layout: ", 0) == 0) why = why.substr(8);
      return reject(why, name);
    }
    ++result_.fitting, ++result_.considered;
    result_.best.push_back(std::move(choice));
    // Keep the list short while searching: the top layouts only.
    if (result_.best.size() > static_cast<size_t>(4 * r_.top + 64)) {
      std::nth_element(result_.best.begin(), result_.best.begin() + r_.top, result_.best.end(), better);
      result_.best.resize(static_cast<size_t>(r_.top));
    }
  }

  const SearchRequest& r_;
  SearchResult result_;
  std::map<std::string, Rejected> rejected_;
};

}  // namespace

SearchResult search_layouts(const SearchRequest& r) {
  LOOM_REQUIRE(r.global_batch >= 1, "loom plan: the global batch (--global-batch, sequences per step) must be >= 1");
  LOOM_REQUIRE(r.seq_len >= 1, "loom plan: the sequence length (--seq) must be >= 1");
  LOOM_REQUIRE(r.top >= 1, "loom plan: --top must be >= 1");
  LOOM_REQUIRE(r.max_zero_stage >= 0 && r.max_zero_stage <= 3, "loom plan: --max-zero ", r.max_zero_stage,
               " is invalid: allowed 0 to 3");
  (void)r.cluster.achieved(r.dtype);  // a dtype the cluster has no figure for
  return Search(r).run();
}

std::string layout_name(const train::RunConfig& cfg) {
  const train::ParallelConfig& p = cfg.parallel;
  std::string s = concat("dp ", p.dp, " tp ", p.tp, " pp ", p.pp, " cp ", p.cp, p.ep > 1 ? concat(" ep ", p.ep) : "",
                         ", ZeRO ", p.zero_stage,
                         ", recompute ", cfg.train.recompute, ", mb ", cfg.train.micro_batch, " x ga ",
                         cfg.train.grad_accum);
  if (p.pp > 1) s += concat(", ", p.pp_schedule, p.virtual_stages > 1 ? concat(" v ", p.virtual_stages) : "");
  return s;
}

std::string search_table(const SearchResult& s, const SearchRequest& r) {
  std::string out = concat("cluster: ", r.cluster.name, ", ", r.cluster.nodes, " node(s) x ", r.cluster.devices_per_node,
                           " devices of ", r.cluster.memory_bytes / kGiB, " GiB\n", "searched ", s.considered,
                           " layouts: ", s.fitting, " fit memory and reach the global batch of ", r.global_batch,
                           " x ", r.seq_len, " tokens\n");
  char line[512];
  std::snprintf(line, sizeof line, "%-4s %-72s %9s %10s %12s %6s\n", "#", "layout", "mem GiB", "step s", "tokens/s",
                "MFU %");  // mem: the fullest rank's tag peaks summed
  out += line;
  for (size_t i = 0; i < s.best.size(); ++i) {
    const Choice& c = s.best[i];
    std::snprintf(line, sizeof line, "%-4zu %-72s %9.3g %10.4g %12.5g %6.1f\n", i + 1, layout_name(c.cfg).c_str(),
                  c.peak_bytes / kGiB, c.time.total, c.time.tokens_per_second, 100 * c.time.mfu);
    out += line;
    out += concat("     ", step_time_line(c.time), "\n");
    std::string tags;  // the fullest rank's peak per tag, the tags it uses
    for (int t = 0; t < kNumMemTags; ++t) {
      const auto tag = static_cast<MemTag>(t);
      if (c.memory[tag].peak == 0) continue;
      char gib[32];
      std::snprintf(gib, sizeof gib, "%.3g", static_cast<double>(c.memory[tag].peak) / kGiB);
      tags += concat(tags.empty() ? "" : ", ", mem_tag_name(tag), " ", gib);
    }
    out += concat("     memory GiB at peak on rank ", c.fullest_rank, ": ", tags, "\n");
  }
  if (!s.rejected.empty()) out += "rejected:\n";
  for (const Rejected& rej : s.rejected) out += concat("  ", rej.count, " x ", rej.reason, " (e.g. ", rej.example, ")\n");
  return out;
}

std::string search_json(const SearchResult& s) {
  std::string out;
  for (const Choice& c : s.best) {
    const train::ParallelConfig& p = c.cfg.parallel;
    nlohmann::ordered_json j = {{"layout", layout_name(c.cfg)}, {"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp},
                                {"cp", p.cp}, {"ep", p.ep}, {"zero_stage", p.zero_stage}, {"recompute", c.cfg.train.recompute},
                                {"micro_batch", c.cfg.train.micro_batch}, {"grad_accum", c.cfg.train.grad_accum},
                                {"pp_schedule", p.pp > 1 ? p.pp_schedule : ""}, {"virtual_stages", p.virtual_stages},
                                {"peak_bytes", c.peak_bytes}, {"step_s", c.time.total},
                                {"tokens_per_s", c.time.tokens_per_second}, {"mfu", c.time.mfu},
                                {"compute_s", c.time.compute}, {"tp_s", c.time.tp}, {"cp_s", c.time.cp}, {"ep_s", c.time.ep},
                                {"bubble_s", c.time.bubble}, {"pp_s", c.time.pp}, {"dp_s", c.time.dp},
                                {"optimizer_s", c.time.optimizer}};
    j["fullest_rank"] = c.fullest_rank;
    for (int t = 0; t < kNumMemTags; ++t)  // that rank's peak per tag, as --memory-json names them
      j["peak_bytes_by_tag"][std::string(mem_tag_name(static_cast<MemTag>(t)))] = c.memory.tags[static_cast<size_t>(t)].peak;
    out += j.dump() + "\n";
  }
  for (const Rejected& r : s.rejected)
    out += nlohmann::ordered_json({{"rejected", r.reason}, {"count", r.count}, {"example", r.example}}).dump() + "\n";
  return out;
}

}  // namespace loom::plan
