// LoRA under data parallelism (model/lora.h, [lora]): adapters trained on a
// frozen base over dp = N, under each ZeRO stage, give the losses of one
// process with the same global batch (DESIGN.md §1.1, 1e-5 over 20 steps);
// a checkpoint of adapters resumes under another dp size and stage, and is
// refused on another base.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "io/gguf.h"
#include "model/config_json.h"
#include "model/gguf_model.h"
#include "model/lora.h"
#include "model/params.h"
#include "parallel/dp_run.h"
#include "train/checkpoint.h"

namespace loom::test {
namespace {

namespace fs = std::filesystem;
using train::RunConfig;

constexpr int64_t kSteps = 20;
constexpr double kTolerance = 1e-5;

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
  return a.size() == b.size() ? worst : 1.0;
}

// The base model (gpt2-tiny or llama-tiny, seed `seed`) written by rank 0
// into dir/name.
fs::path write_base(const fs::path& dir, const std::string& name, uint64_t seed, const char* preset = "gpt2-tiny") {
  const fs::path out = dir / name;
  if (world().rank() == 0 && !fs::exists(out)) {
    model::ModelConfig cfg = model::model_preset(preset);
    cfg.vocab_size = 512;
    Pools pools;
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
    OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(flat, specs, seed);
    model::save_model_dir(out.string(), cfg, flat, model::ParamLayout::loom);
  }
  world().barrier()->wait();
  return out;
}

// The model cfg (seed 5, vocab 512) written by rank 0 as a GGUF file of
// `weights` into dir/name.
fs::path write_gguf_base(const fs::path& dir, const std::string& name, model::ModelConfig cfg,
                         model::GgufWeights weights) {
  const fs::path out = dir / name;
  cfg.vocab_size = 512;
  if (world().rank() == 0 && !fs::exists(out)) {
    Pools pools;
    OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {model::param_count(cfg)});
    model::init_params(flat, model::param_specs(cfg), 5);
    io::GgufWriter w;
    model::gguf_add_model(w, cfg, flat, weights, name);
    w.write(out.string());
  }
  world().barrier()->wait();
  return out;
}

class LoraDataParallelTest : public SharedDataTest<"loom_mpi_lora", 4000> {
 protected:
  static int64_t micro_batch() { return std::max(1, 8 / world().size()); }

  // dp_config's run, training rank-4 adapters on every linear of the base.
  static RunConfig lora_config(const fs::path& base, int64_t dp, int64_t zero_stage) {
    RunConfig c = dp_config(dir_, dp, zero_stage, micro_batch(), 2);
    c.train.lr = 1e-2;
    c.lora.adapters.rank = 4;
    c.lora.adapters.alpha = 8;
    c.lora.base = base.string();
    c.model = model::load_model_dir(c.lora.base).config;
    return c;
  }
  static RunConfig alone(RunConfig c) {
    c.train.micro_batch *= c.parallel.dp;
    c.parallel.dp = 1, c.parallel.tp = 1, c.parallel.pp = 1, c.parallel.zero_stage = 0;
    c.parallel.sequence_parallel = false;
    return c;
  }
  // cfg on the first pp x dp x tp ranks of the world against one process: the
  // largest relative loss difference over kSteps, reported.
  static double against_one_process(const RunConfig& cfg, const std::string& what) {
    const RunConfig one = alone(cfg);
    const std::vector<double> ref = reference(one);
    const SubMesh g = sub_mesh(static_cast<int>(cfg.parallel.pp), static_cast<int>(cfg.parallel.dp),
                               static_cast<int>(cfg.parallel.tp));
    const std::vector<double> got = run_resumable(g, cfg, 0, kSteps, {}, {}, what);
    const double diff = max_relative_difference(got, ref);
    if (world().rank() == 0 && diff > kTolerance)
      for (size_t i = 0; i < std::min<size_t>(3, got.size()); ++i)
        std::printf("  step %zu: %.8f vs %.8f\n", i + 1, got[i], ref[i]);
    if (world().rank() == 0) std::printf("[lora] %s: max relative loss difference %.3g\n", what.c_str(), diff);
    return diff;
  }
  // cfg on rank 0 alone, its losses on every rank.
  static std::vector<double> reference(const RunConfig& cfg) {
    return rank_zero_values(kSteps, [&] { return run_losses(cfg, nullptr, kSteps); });
  }
};

TEST_F(LoraDataParallelTest, AdaptersOverEveryZeroStageMatchOneProcessOver20Steps) {
  const fs::path base = write_base(dir_, "base", 5);
  const std::vector<double> one = reference(alone(lora_config(base, world().size(), 0)));
  EXPECT_LT(one.back(), one.front()) << "the adapters should learn the data";
  for (int stage = 0; stage <= 3; ++stage) {
    const std::vector<double> dp = mesh_losses(lora_config(base, world().size(), stage), kSteps);
    const double diff = max_relative_difference(dp, one);
    if (world().rank() == 0)
      std::printf("[lora dp N=%d] zero_stage=%d: max relative loss difference %.3g\n", world().size(), stage, diff);
    EXPECT_LE(diff, kTolerance) << "zero_stage " << stage;
  }
}

TEST_F(LoraDataParallelTest, TensorParallelAdaptersMatchOneProcessOver20Steps) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* preset : {"gpt2-tiny", "llama-tiny"})
    for (bool sp : {false, true}) {
      RunConfig c = lora_config(write_base(dir_, std::string("base_") + preset, 5, preset), 1, 0);
      c.parallel.tp = 2;
      c.parallel.sequence_parallel = sp;
      const std::string name = concat(preset, " tp 2", sp ? " SP" : "");
      EXPECT_LE(against_one_process(c, name), kTolerance);
      if (world().size() < 4) continue;
      c.parallel.dp = 2, c.parallel.zero_stage = sp ? 3 : 1;
      EXPECT_LE(against_one_process(c, concat(name, " x dp 2, ZeRO ", c.parallel.zero_stage)), kTolerance);
    }
}

TEST_F(LoraDataParallelTest, PipelinedAdaptersMatchOneProcessOver20Steps) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    RunConfig c = lora_config(write_base(dir_, std::string("base_") + preset, 5, preset), 1, 0);
    c.parallel.pp = 2;
    c.train.recompute = "full";
    EXPECT_LE(against_one_process(c, std::string(preset) + " pp 2 (1f1b, full recompute)"), kTolerance);
  }
}

// QLoRA under tensor parallelism: each tp rank holds its slice of the
// quantized base's blocks (model/quant_weights.h), and tp 2 (with SP, and
// on 4 ranks or more with SP x dp 2 ZeRO 2 too) gives one process's losses
// on the same file. GPT-2 tiny in q8_0 (every linear in blocks on each
// rank; the tied head's vocabulary split) and a Llama of C = 256 in q4_K (q
// and k rows in llama.cpp's order; o_proj's 128 columns a rank are not
// whole 256-value blocks, so that weight is dequantized there).
TEST_F(LoraDataParallelTest, QuantizedBaseSplitOverTpMatchesOneProcess) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  model::ModelConfig llama = model::model_preset("llama-tiny");
  llama.n_embd = 256, llama.d_ff = 512;
  const std::vector<std::pair<fs::path, const char*>> bases = {
      {write_gguf_base(dir_, "gpt2_q8_0.gguf", model::model_preset("gpt2-tiny"), model::GgufWeights::q8_0), "q8_0"},
      {write_gguf_base(dir_, "llama_q4_K.gguf", llama, model::GgufWeights::q4_K), "q4_K"}};
  for (const auto& [base, type] : bases) {
    RunConfig c = lora_config(base, 1, 0);
    c.parallel.tp = 2;
    const std::string name = concat(model::family_name(c.model.family), " ", type, " base, tp 2");
    EXPECT_LE(against_one_process(c, name), kTolerance);
    c.parallel.sequence_parallel = true;
    if (world().size() >= 4) c.parallel.dp = 2, c.parallel.zero_stage = 2;
    EXPECT_LE(against_one_process(c, concat(name, " SP", c.parallel.dp > 1 ? " x dp 2, ZeRO 2" : "")), kTolerance);
  }
}

// lora.dropout: each element of an adapter's input is dropped by a draw
// keyed by its global sample, position, linear and feature (DESIGN.md §1.3),
// so every layout drops the same ones: dp (ZeRO 2), tp 2 with and without SP
// (a row-parallel linear's columns counted from the rank's offset), tp x dp
// and pp 2 equal one process over 20 steps, and the masks do act (the
// losses differ from dropout 0).
TEST_F(LoraDataParallelTest, DropoutAdaptersMatchOneProcessUnderEveryLayout) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const fs::path base = write_base(dir_, std::string("base_") + preset, 5, preset);
    RunConfig c = lora_config(base, world().size(), 2);
    c.lora.adapters.dropout = 0.1;
    RunConfig plain = c;
    plain.lora.adapters.dropout = 0;
    const std::vector<double> one = reference(alone(c)), without = reference(alone(plain));
    EXPECT_GT(max_relative_difference(one, without), 1e-4) << preset << ": dropout changed nothing";
    EXPECT_LT(one.back(), one.front()) << preset << ": the adapters should learn the data under dropout";
    const double dp = max_relative_difference(mesh_losses(c, kSteps), one);
    if (world().rank() == 0)
      std::printf("[lora dropout] %s dp %d ZeRO 2: max relative loss difference %.3g\n", preset, world().size(), dp);
    EXPECT_LE(dp, kTolerance) << preset;
    if (world().size() < 2) continue;
    RunConfig t = lora_config(base, 1, 0);
    t.lora.adapters.dropout = 0.1;
    t.parallel.tp = 2;
    for (bool sp : {false, true}) {
      t.parallel.sequence_parallel = sp;
      EXPECT_LE(against_one_process(t, concat(preset, " dropout tp 2", sp ? " SP" : "")), kTolerance);
    }
    if (world().size() >= 4) {
      t.parallel.dp = 2, t.parallel.zero_stage = 1;
      EXPECT_LE(against_one_process(t, concat(preset, " dropout tp 2 SP x dp 2")), kTolerance);
    }
    RunConfig p = lora_config(base, 1, 0);
    p.lora.adapters.dropout = 0.1;
    p.parallel.pp = 2;
    p.train.recompute = "full";
    EXPECT_LE(against_one_process(p, concat(preset, " dropout pp 2 (1f1b, full recompute)")), kTolerance);
  }
}

// lora.init: adapters that start from a PEFT directory (written here with
// random values by rank 0) give one process's losses under ZeRO 3 and tp,
// and not a fresh start's.
TEST_F(LoraDataParallelTest, AdaptersStartFromAPeftDirectoryUnderEveryLayout) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const fs::path base = write_base(dir_, "base", 5), peft = dir_ / "peft_start";
  RunConfig c = lora_config(base, 1, 0);
  if (world().rank() == 0) {
    Pools pools;
    const std::vector<model::ParamSpec> specs = model::lora_param_specs(c.model, c.lora.adapters);
    OwnedTensor values = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(values, specs, 3);
    // B random too, so the start shows in the loss. (Not constant: a constant
    // B sends each linear's output gradient summed over features into A,
    // which LayerNorm makes zero but for rounding, and AdamW's first step
    // turns rounding into +-lr.)
    for (model::ParamSpec s : specs)
      if (s.name.ends_with("lora_B.weight")) {
        s.init = model::ParamInit::uniform, s.init_std = 0.05f;
        model::init_param(model::param_view(values, s), s, 4);
      }
    model::save_peft_adapter(peft.string(), c.model, c.lora.adapters, values, c.lora.base);
  }
  world().barrier()->wait();
  const std::vector<double> fresh = reference(c);
  c.lora.init = peft.string();
  RunConfig zero3 = c, tp = c;
  zero3.parallel.dp = 2, zero3.parallel.zero_stage = 3, zero3.train.micro_batch /= 2;
  tp.parallel.tp = 2;
  if (zero3.train.micro_batch >= 1) {
    EXPECT_LE(against_one_process(zero3, "from PEFT, dp 2 ZeRO 3"), kTolerance);
  }
  EXPECT_LE(against_one_process(tp, "from PEFT, tp 2"), kTolerance);
  EXPECT_GT(std::abs(reference(c).front() - fresh.front()), 1e-5) << "the PEFT adapters did not change the start";
}

TEST_F(LoraDataParallelTest, CheckpointResumesUnderAnotherStageAndIsRefusedOnAnotherBase) {
  const fs::path base = write_base(dir_, "base", 5), other = write_base(dir_, "other_base", 6);
  const fs::path root = dir_ / "ckpt";
  const int n = world().size();
  const RunConfig saved = lora_config(base, n, n > 1 ? 2 : 0);
  const std::vector<double> straight = mesh_losses(saved, 6);
  const SubMesh all = sub_mesh(1, n, 1);
  save_after_steps(all, saved, 3, root);
  const std::string step_dir = (root / "step_000003").string();
  // Resumed under ZeRO 1 (or alone): the same continued losses.
  const RunConfig resumed = lora_config(base, n, n > 1 ? 1 : 0);
  const std::vector<double> after = run_resumable(all, resumed, 3, 6, step_dir, {}, "lora resume");
  ASSERT_EQ(after.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(after[i], straight[3 + i], 1e-5 * straight[3 + i]) << i;
  // On another base: refused, naming both.
  TrainerOn on(lora_config(other, n, 0), &world());
  try {
    train::load_checkpoint(on.t, step_dir);
    ADD_FAILURE() << "a checkpoint of adapters resumed on another base";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume them on the same base model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::test
