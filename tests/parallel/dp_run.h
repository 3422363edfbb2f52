// Shared by the multi-rank training tests (tests/parallel/mpi_test_*.cpp):
// a data shard every rank of the world sees (in a shared_temp_dir,
// common/mpi_fixtures.h) and the suites built on it, a tiny run config over
// it, and running a trainer for a few steps on the world, a sub-mesh of it or
// rank 0 alone.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/mpi_env.h"
#include "common/mpi_fixtures.h"
#include "common/run_context.h"
#include "core/memory.h"
#include "core/threads.h"
#include "mesh/mesh.h"
#include "model/config.h"
#include "text/shards.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace loom::test {

// A token stream with something to learn beyond unigram counts: a fixed
// 61-token "sentence" of pseudo-random ids below `vocab`, repeated.
inline std::vector<int32_t> repeated_sentence_tokens(int64_t n, int32_t vocab) {
  std::vector<int32_t> sentence(61);
  uint32_t x = 12345;
  for (int32_t& t : sentence) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes' LCG
    t = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  std::vector<int32_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = sentence[i % 61];
  return out;
}

// A shared_temp_dir holding one train shard (train_000000.bin) of n tokens
// of repeated_sentence_tokens below 512, written by rank 0. Collective.
inline std::filesystem::path make_shared_data_dir(const std::string& prefix, int64_t n_tokens) {
  const std::filesystem::path dir = shared_temp_dir(prefix);
  if (world().rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    text::write_shard((dir / "train_000000.bin").string(), repeated_sentence_tokens(n_tokens, 512), 1);
  }
  world().barrier()->wait();
  return dir;
}

// A suite name as a template argument (SharedDataTest's).
template <size_t N>
struct SuiteName {
  char text[N];
  constexpr SuiteName(const char (&s)[N]) { std::copy_n(s, N, text); }
};

// The base of a suite that trains on a shared data dir: one thread per rank,
// dir_ = make_shared_data_dir(Prefix, Tokens) made before the suite's first
// test and removed after its last (suites derived from one fixture share it).
template <SuiteName Prefix, int64_t Tokens>
class SharedDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_num_threads(1);
    dir_ = make_shared_data_dir(Prefix.text, Tokens);
  }
  static void TearDownTestSuite() { remove_shared_dir(dir_); }

  static inline std::filesystem::path dir_;
};

// A layout's groups on the first pp x dp x cp x tp ranks of the world (the
// mesh's order: tp fastest, then cp, dp, pp). Every rank takes part in the
// splits: members get their groups, the others a group of the rest.
// Collective.
struct SubMesh {
  bool member = false;
  std::unique_ptr<comm::Communicator> ranks;  // the first pp x dp x cp x tp world ranks (or the others)
  std::unique_ptr<test::TestContext> run;     // members only
  Context& ctx() const { return run->ctx(); }
};
inline SubMesh sub_mesh(int pp, int dp, int tp, int cp = 1, int ep = 1) {
  comm::Communicator& w = world();
  SubMesh g;
  g.member = w.rank() < pp * dp * cp * tp;
  g.ranks = w.split(g.member ? 0 : 1, w.rank(), "sub_world");
  if (g.member) g.run = std::make_unique<test::TestContext>(mesh::MeshShape{pp, dp, cp, tp, ep}, g.ranks.get());
  return g;
}

// gpt2-tiny, T = 16, 20 steps at lr 3e-3 with warmup, shuffled train data,
// no evaluation; dp ranks of micro_batch sequences, grad_accum micro-batches.
// The lr is below tiny_run.h's 1e-2 on purpose: at 1e-2 the loss spikes in
// the first steps (5.1 to 7.5 at step 5), and the spikes blow a rounding
// difference between two reduction orders (1e-8 at step 1) up to 5e-5 after
// 20 steps (N = 3, fp32); at 3e-3 the loss falls smoothly (6.25 to ~3.5) and
// the difference stays near 1e-7.
// bucket_mb is small so that stages 0-2 cut the ~0.5 MiB of gradients into
// several buckets instead of one.
inline train::RunConfig dp_config(const std::filesystem::path& data_dir, int64_t dp, int64_t zero_stage,
                                  int64_t micro_batch, int64_t grad_accum) {
  train::RunConfig c;
  c.model = model::model_preset("gpt2-tiny");
  c.data.train = {(data_dir / "train_*.bin").string()};
  c.data.shuffle = true;
  c.train.seq_len = 16;
  c.train.micro_batch = micro_batch;
  c.train.grad_accum = grad_accum;
  c.train.steps = 20;
  c.train.lr = 3e-3;
  c.train.min_lr = 3e-4;
  c.train.warmup_steps = 2;
  c.train.eval_every = 0;
  c.parallel.dp = dp;
  c.parallel.zero_stage = zero_stage;
  c.parallel.bucket_mb = 0.1;
  c.log.peak_tflops = 1.0;
  return c;
}

// The pipeline suites' model (mpi_test_pp*.cpp): 8 layers, so pp = 4 (and
// pp = 2 or 4 with 2 chunks per rank) has whole layers on every stage; GPT-2
// (tied, 12 heads) or Llama (GQA: 24 query / 12 key-value heads).
inline model::ModelConfig eight_layer_model(const std::string& family) {
  model::ModelConfig m = model::model_preset(family == "gpt2" ? "gpt2-tiny" : "llama-tiny");
  m.n_layer = 8, m.n_embd = 96, m.d_ff = family == "gpt2" ? 384 : 240, m.vocab_size = 512;
  m.n_head = family == "gpt2" ? 12 : 24, m.n_kv_head = 12;
  return m;
}

// Steps t until it has done `until` steps; the stats of the steps run.
inline std::vector<train::StepStats> train_until(train::Trainer& t, int64_t until) {
  std::vector<train::StepStats> out;
  while (t.steps_done() < until) out.push_back(t.step());
  return out;
}

inline std::vector<double> losses_of(const std::vector<train::StepStats>& steps) {
  std::vector<double> out;
  for (const train::StepStats& s : steps) out.push_back(s.loss);
  return out;
}

// A trainer of cfg on the mesh its [parallel] sizes give over `ranks` (the
// world or a sub-group of it; nullptr: one process), with its context.
struct TrainerOn {
  TrainerOn(const train::RunConfig& cfg, comm::Communicator* ranks)
      : run(train::mesh_shape(cfg.parallel), ranks), t(cfg, run.ctx()) {}
  TestContext run;
  train::Trainer t;
};

// A fresh trainer of cfg on `ranks` (nullptr: alone), `steps` steps: the losses.
inline std::vector<double> run_losses(const train::RunConfig& cfg, comm::Communicator* ranks, int64_t steps) {
  TrainerOn on(cfg, ranks);
  return losses_of(train_until(on.t, steps));
}

// cfg trained `steps` steps on the mesh pp x dp x tp of the whole world: the
// losses (the same on every rank).
inline std::vector<double> mesh_losses(const train::RunConfig& cfg, int64_t steps) {
  return run_losses(cfg, &world(), steps);
}

// cfg trained `steps` steps on g's ranks (its members) and checkpointed
// under root; every rank returns once the checkpoint is complete.
// Collective over the world.
inline void save_after_steps(const SubMesh& g, const train::RunConfig& cfg, int64_t steps,
                             const std::filesystem::path& root) {
  if (g.member) {
    train::Trainer t(cfg, g.ctx());
    train_until(t, steps);
    train::save_checkpoint(t, root.string(), 0);
  }
  world().barrier()->wait();
}

// cfg on g's ranks (its members) from scratch (resume_dir empty) or from
// the checkpoint in resume_dir (which holds step save_at) up to `steps`,
// checkpointed under save_root after save_at steps if given: the losses of
// the steps it ran, on every rank. Collective over the world.
inline std::vector<double> run_resumable(const SubMesh& g, const train::RunConfig& cfg, int64_t save_at, int64_t steps,
                                         const std::filesystem::path& resume_dir,
                                         const std::filesystem::path& save_root, const std::string& name) {
  std::vector<double> losses;
  if (g.member) {
    train::Trainer t(cfg, g.ctx());
    if (!resume_dir.empty()) {
      EXPECT_EQ(train::load_checkpoint(t, resume_dir.string()), save_at) << name;
    }
    if (!save_root.empty()) {
      losses = losses_of(train_until(t, save_at));
      train::save_checkpoint(t, save_root.string(), 0);
    }
    const std::vector<double> rest = losses_of(train_until(t, steps));
    losses.insert(losses.end(), rest.begin(), rest.end());
  }
  return broadcast_values(world(), losses, static_cast<size_t>(resume_dir.empty() ? steps : steps - save_at));
}

// cfg trained `steps` steps by rank 0 alone, its losses on every rank;
// cached by the whole config (several layouts share a reference). Collective.
inline std::vector<double> reference_losses(const train::RunConfig& cfg, int64_t steps,
                                            std::map<std::string, std::vector<double>>& cache) {
  const std::string key = train::run_config_to_json(cfg).dump();
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  return cache[key] = rank_zero_values(static_cast<size_t>(steps), [&] { return run_losses(cfg, nullptr, steps); });
}

// A parallel layout's run of cfg on the world's mesh against the single
// process `alone` on the same global batch: the max relative loss difference
// over `steps` printed by rank 0 (as "[what N=n] name: ...") and held to
// `tolerance`; the reference must learn. Collective.
inline void expect_mesh_matches_one_process(const char* what, const std::string& name, const train::RunConfig& cfg,
                                            const train::RunConfig& alone, int64_t steps, double tolerance,
                                            std::map<std::string, std::vector<double>>& cache) {
  const std::vector<double> mesh = mesh_losses(cfg, steps), one = reference_losses(alone, steps, cache);
  const double diff = max_relative_difference(mesh, one);
  if (world().rank() == 0) {
    std::printf("[%s N=%d] %s: max relative loss difference %.3g (loss %.4f -> %.4f)\n", what, world().size(),
                name.c_str(), diff, one.front(), one.back());
    std::fflush(stdout);
  }
  EXPECT_LE(diff, tolerance) << name;
  EXPECT_LT(one.back(), 0.8 * one.front()) << "the reference run should learn the data";
}

}  // namespace loom::test
