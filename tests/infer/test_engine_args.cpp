// EngineArgs, the engine settings every command takes (generate, serve,
// bench serve): what they become in an EngineConfig, and the errors that
// name the flag.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "infer/engine_args.h"
#include "model/paged_runner.h"

namespace loom::infer {
namespace {

model::ModelConfig model_of(int64_t max_seq_len) {
  model::ModelConfig c;
  c.n_layer = 2, c.n_embd = 32, c.n_head = 4, c.n_kv_head = 4, c.d_ff = 64, c.vocab_size = 100;
  c.max_seq_len = max_seq_len;
  return c;
}

void expect_error(const EngineArgs& a, const std::string& part) {
  try {
    a.validate();
    ADD_FAILURE() << "no error; expected one naming " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(EngineArgs, BecomeTheEngineConfig) {
  EngineArgs a;
  a.kv_dtype = "bf16", a.block_size = 32, a.max_num_seqs = 3, a.max_num_batched_tokens = 100;
  a.batch_invariant = false, a.kv_cache_mb = 2;
  const EngineConfig c = a.config(model_of(128));
  EXPECT_EQ(c.kv_dtype, DType::bf16);
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.max_num_seqs, 3);
  EXPECT_EQ(c.max_num_batched_tokens, 100);
  EXPECT_FALSE(c.batch_invariant);
  EXPECT_EQ(c.kv_cache_bytes, 2 << 20);
  EXPECT_EQ(c.max_model_len, 128) << "0: the model's";
  a.max_model_len = 64;
  EXPECT_EQ(a.config(model_of(128)).max_model_len, 64);
  a.max_model_len = 1000;
  EXPECT_EQ(a.config(model_of(128)).max_model_len, 128) << "at most the model's";
}

TEST(EngineArgs, TheDefaultsAreTheSameForEveryCommand) {
  const EngineArgs a;
  EXPECT_EQ(a.max_num_seqs, 64);
  EXPECT_EQ(a.max_num_batched_tokens, 512);
  EXPECT_EQ(a.block_size, 16);
  EXPECT_EQ(a.config(model_of(64)).kv_cache_bytes, 0) << "sized by the engine's one rule";
}

TEST(EngineArgs, ErrorsNameTheFlag) {
  EngineArgs a;
  a.dtype = "fp8";
  expect_error(a, "--dtype");
  a = {}, a.kv_dtype = "int4";
  expect_error(a, "--kv-dtype");
  a = {}, a.block_size = 0;
  expect_error(a, "--block-size");
  // Huge blocks were a division by a size that overflowed to 0 (SIGFPE).
  for (const int64_t b : {kMaxBlockSize + 1, int64_t{1} << 54, INT64_MAX}) {
    a = {}, a.block_size = b;
    expect_error(a, "--block-size");
  }
  a = {}, a.max_model_len = -1;
  expect_error(a, "--max-model-len");
  a = {}, a.kv_cache_mb = -1;
  expect_error(a, "--kv-cache-mb");
}

TEST(EngineConfig, AHugeBlockSizeIsAnErrorNotAnOverflow) {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  EngineConfig c;
  c.block_size = int64_t{1} << 54;  // 2 * layers * block * heads * head_size * 4 bytes wrapped to 0
  EXPECT_THROW(resolve_engine_config(c, cfg), Error);
  EXPECT_THROW(model::kv_block_bytes(cfg, int64_t{1} << 54, DType::f32), Error);
  EXPECT_EQ(model::kv_block_bytes(cfg, 16, DType::f32), 2 * cfg.n_layer * 16 * cfg.n_kv_head * cfg.head_size() * 4);
}

// The KV cache's default: max_num_seqs sequences of max_model_len, within a
// memory limit that holds at least one of them (else the limit is ignored).
TEST(EngineConfig, TheDefaultKvCacheFitsTheMemoryLimit) {
  EngineConfig c;
  c.block_size = 16, c.max_num_seqs = 8, c.max_model_len = 64;  // 4 blocks a sequence
  const model::ModelConfig m = model_of(64);
  const int64_t block = model::kv_block_bytes(m, 16, DType::f32);
  const auto blocks_within = [&](int64_t limit) {
    EngineConfig l = c;
    l.kv_memory_limit_bytes = limit;
    return resolve_engine_config(l, m).num_blocks;
  };
  EXPECT_EQ(blocks_within(0), 1 + 8 * 4) << "no limit: every sequence, and the null block";
  EXPECT_EQ(blocks_within(1000 * block), 1 + 8 * 4) << "a limit above the need changes nothing";
  EXPECT_EQ(blocks_within(20 * block), 20) << "within the limit";
  EXPECT_EQ(blocks_within(5 * block), 5) << "one sequence and the null block: still fits";
  EXPECT_EQ(blocks_within(4 * block), 1 + 8 * 4) << "a limit below one sequence is ignored";
  EngineConfig given = c;
  given.kv_cache_bytes = 10 * block, given.kv_memory_limit_bytes = 2 * block;
  EXPECT_EQ(resolve_engine_config(given, m).num_blocks, 10) << "kv_cache_bytes given: the limit is not applied";
}

}  // namespace
}  // namespace loom::infer
