// train::AdamW (train/optimizer.h) over a DataParallel in one process: the
// weight decay rule, and every ZeRO stage (the sharding DataParallel owns)
// giving bitwise the plain model's training in a group of one (the
// multi-rank proofs are tests/parallel/mpi_test_dp*.cpp).
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/dp.h"

namespace loom::train {
namespace {

using parallel::DataParallel;
using parallel::DpOptions;

TEST(AdamW, WeightDecayAppliesTo2DWeightsOnly) {
  Pools pools;
  model::Model m(model::model_preset("gpt2-tiny"), 1, 4, pools, {.storage = DataParallel::model_storage(0)});
  AdamWOptions o;
  o.weight_decay = 0.5;
  comm::SelfCommunicator alone;
  DataParallel dp(m, alone, alone, {}, pools);
  AdamW adamw(dp, o);
  dp.init_params(1);
  dp.zero_grads();  // zero gradients: the update is the decay alone
  const float wte0 = m.param("wte.weight").data_as<float>()[5];
  const float fc0 = m.param("h.0.mlp.c_fc.weight").data_as<float>()[3];
  const float ln0 = m.param("h.0.ln_1.weight").data_as<float>()[0];
  const float bias0 = m.param("h.0.attn.c_attn.bias").data_as<float>()[0];
  adamw.step(0.1, 1.f);
  EXPECT_FLOAT_EQ(m.param("wte.weight").data_as<float>()[5], wte0 * (1.f - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(m.param("h.0.mlp.c_fc.weight").data_as<float>()[3], fc0 * (1.f - 0.1f * 0.5f));
  EXPECT_EQ(m.param("h.0.ln_1.weight").data_as<float>()[0], ln0);
  EXPECT_EQ(m.param("h.0.attn.c_attn.bias").data_as<float>()[0], bias0);
  EXPECT_EQ(adamw.steps_taken(), 1);
}

// Two steps of a model in a group of one under `stage`: appends each
// micro-batch's loss and each step's gradient norm to *loss; returns the
// parameters after the updates.
std::vector<float> two_steps(const char* preset, int stage, DType compute, bool offload, int micro_batches,
                             std::vector<float>* loss) {
  Pools pools;
  const model::ModelConfig cfg = model::model_preset(preset);
  model::Model m(cfg, 2, 8, pools, {.compute = compute, .storage = DataParallel::model_storage(stage)});
  DpOptions o;
  o.zero_stage = stage;
  o.bucket_mb = 0.01;  // several buckets
  o.offload_optimizer = offload;
  comm::SelfCommunicator alone;
  DataParallel dp(m, alone, alone, o, pools);
  dp.init_params(3);
  AdamW adamw(dp, {});
  OwnedTensor tok = pools[MemTag::activations].zeros(DType::i32, {2, 8});
  OwnedTensor tgt = pools[MemTag::activations].zeros(DType::i32, {2, 8});
  for (int64_t i = 0; i < 16; ++i) {
    tok.data_as<int32_t>()[i] = static_cast<int32_t>(i * 7 % 50);
    tgt.data_as<int32_t>()[i] = static_cast<int32_t>(i * 3 % 50);
  }
  for (int step = 0; step < 2; ++step) {
    dp.zero_grads();
    for (int k = 0; k < micro_batches; ++k) {
      dp.begin_micro_batch(k == micro_batches - 1);
      loss->push_back(m.forward(tok, tgt));
      m.backward(1.f / static_cast<float>(micro_batches));
    }
    const double norm = dp.grad_norm();
    loss->push_back(static_cast<float>(norm));
    adamw.step(1e-2, static_cast<float>(norm > 1.0 ? 1.0 / norm : 1.0));
  }
  std::vector<float> out(static_cast<size_t>(m.num_params()));
  dp.gather_master(Tensor(out.data(), DType::f32, {m.num_params()}));
  return out;
}

TEST(ZeroStages, EveryStageInAGroupOfOneGivesBitwiseTheSameTraining) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (DType compute : {DType::f32, DType::bf16}) {
      if (compute == DType::bf16 && !kernels::bf16_matmul_unsupported_reason().empty()) continue;
      std::vector<float> loss0;
      const std::vector<float> p0 = two_steps(preset, 0, compute, false, 1, &loss0);
      for (int stage : {0, 1, 2, 3}) {
        for (bool offload : {false, true}) {
          std::vector<float> loss;
          const std::vector<float> p = two_steps(preset, stage, compute, offload, 1, &loss);
          EXPECT_EQ(loss, loss0) << preset << " stage " << stage << " offload " << offload;
          EXPECT_EQ(p, p0) << preset << " stage " << stage << " offload " << offload;
        }
      }
    }
  }
}

// With two micro-batches, stages 2 and 3 add each micro-batch's reduced
// bucket into the shard ((a1 + b1) + (a2 + b2)) where stages 0 and 1 keep
// accumulating in place (((a1 + b1) + a2) + b2): GPT-2's tied embedding gets
// two contributions per micro-batch, so the sums round differently. The
// losses and gradient norms agree to f32 rounding; AdamW divides by sqrt(v),
// which magnifies the rounding of near-zero gradients, so the parameters
// agree to a small fraction of one step (lr = 1e-2).
TEST(ZeroStages, GradientAccumulationAgreesAcrossStagesToRounding) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    std::vector<float> loss0;
    const std::vector<float> p0 = two_steps(preset, 0, DType::f32, false, 2, &loss0);
    for (int stage : {1, 2, 3}) {
      std::vector<float> loss;
      const std::vector<float> p = two_steps(preset, stage, DType::f32, false, 2, &loss);
      ASSERT_EQ(loss.size(), loss0.size());
      for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss[i], loss0[i], 1e-6 * std::abs(loss0[i]));
      double max_diff = 0;
      for (size_t i = 0; i < p.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::abs(p[i] - p0[i])));
      EXPECT_LT(max_diff, 1e-2 * 1e-2) << preset << " stage " << stage;
    }
  }
}

// Checkpoints restore the moments and the update count of the single group.
TEST(AdamW, LoadStateSetsTheMomentsAndTheUpdateCount) {
  Pools pools;
  model::Model m(model::model_preset("gpt2-tiny"), 1, 4, pools, {.storage = DataParallel::model_storage(1)});
  comm::SelfCommunicator alone;
  DataParallel dp(m, alone, alone, {.zero_stage = 1}, pools);
  AdamW adamw(dp, {});
  const int64_t S = dp.shard_numel();
  std::vector<float> mv(static_cast<size_t>(2 * S));
  for (size_t i = 0; i < mv.size(); ++i) mv[i] = static_cast<float>(i % 97) * 0.25f;
  adamw.load_state(Tensor(mv.data(), DType::f32, {S}), Tensor(mv.data() + S, DType::f32, {S}), 7);
  EXPECT_EQ(adamw.steps_taken(), 7);
  EXPECT_EQ(std::vector<float>(adamw.m().data_as<float>(), adamw.m().data_as<float>() + S),
            std::vector<float>(mv.begin(), mv.begin() + S));
  EXPECT_EQ(std::vector<float>(adamw.v().data_as<float>(), adamw.v().data_as<float>() + S),
            std::vector<float>(mv.begin() + S, mv.end()));
}

}  // namespace
}  // namespace loom::train
