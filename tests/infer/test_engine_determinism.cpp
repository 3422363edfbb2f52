// The engine's determinism claim, asserted bitwise: a request's tokens,
// log-probabilities, top log-probabilities and finish reasons depend only on
// the request (its prompt, parameters and seed) and the KV block size, never
// on what else runs, how its prompt is chunked, or whether it was preempted
// and recomputed. 64 seeded requests on the quickstart-shaped GPT-2 trained
// in quickstart_model.h (peaked distributions, so stop tokens and stop
// sequences are actually reached): greedy and sampled (temperature, top-k,
// top-p, min-p, presence / frequency / repetition penalties), top_logprobs 0,
// 5 or 20, n = 1, 2 or 3, eight groups sharing a 40-token prefix (prefix-cache
// hits), stop token ids, EOS with min_tokens, and stop sequences matched by
// this test on the generated ids, which ends the sequence with
// finish_sequence(..., stop) as a stop string would. They run
//   (a) one at a time, (b) all 64 at once, (c) all at once in a KV cache so
//   small that requests are preempted, (d) all at once with a step budget of
//   1, 7 and 64 tokens (chunked prefill),
// every run at block size 16 (the paged kernel reduces one block at a time:
// the block size is part of the identity, test_engine.cpp); each must give
// the very same bits for every sequence, and leave the KV cache empty.
//
// This rests on the kernels' batch invariance (tests/kernels/
// test_batch_invariance.cpp) and on the sampler's: sample_rows gives each row
// exactly what sample_at gives it alone (SamplerBatchInvariance below).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/memory.h"
#include "infer/engine.h"
#include "infer/quickstart_model.h"
#include "infer/sampler.h"
#include "kernels/cpu_isa.h"

namespace loom::infer {
namespace {

using Tokens = std::vector<int32_t>;
using quickstart::letter;

constexpr int64_t kRequests = 64, kBlockSize = 16;

struct Spec {
  Tokens prompt;
  GenerationParams params;
  Tokens stop_sequence;  // ends the sequence (finish_sequence) when its output ends with it; empty: none
};

// Request i: group i % 8 shares a 40-token prefix (2.5 blocks of 16); a
// suffix of 1 to 12 tokens of its own, some off the training stream; the
// sampling, stop and logprob options cycle with i.
std::vector<Spec> specs() {
  std::vector<Spec> out;
  for (int64_t i = 0; i < kRequests; ++i) {
    Spec s;
    const int64_t group = i % 8;
    s.prompt = quickstart::cycle(40, group);
    const int64_t suffix = 1 + (i * 5) % 12;
    for (int64_t k = 0; k < suffix; ++k)
      s.prompt.push_back(k % 3 == 2 ? static_cast<int32_t>((i * 7919 + k * 104729) % 50257)
                                    : letter((group + 40 + k + i / 8) % quickstart::kAlphabet));
    SamplerConfig& sc = s.params.sampler;
    sc.seed = static_cast<uint64_t>(1000 + 17 * i);
    switch (i % 8) {
      case 0: sc.temperature = 0.f; break;
      case 1: sc.temperature = 0.8f; break;
      case 2: sc.temperature = 1.f, sc.top_k = 5; break;
      case 3: sc.temperature = 1.2f, sc.top_p = 0.9f; break;
      case 4: sc.temperature = 1.f, sc.min_p = 0.05f; break;
      case 5: sc.temperature = 0.9f, sc.presence_penalty = 0.5f, sc.frequency_penalty = 0.3f; break;
      case 6: sc.temperature = 1.f, sc.repetition_penalty = 1.3f; break;
      case 7: sc.temperature = 0.f, sc.repetition_penalty = 1.2f, sc.frequency_penalty = -0.5f; break;
    }
    s.params.top_logprobs = (i % 3 == 0) ? 5 : (i % 3 == 1 ? 20 : 0);
    s.params.n = (i % 5 == 0) ? 3 : (i % 5 == 1 ? 2 : 1);
    s.params.stop.max_tokens = 8 + i % 9;
    if (i % 4 == 2) s.params.stop.stop_token_ids = {letter((group + 43) % quickstart::kAlphabet)};
    if (i % 6 == 1) s.params.stop.eos_token_ids = {letter((group + 44) % quickstart::kAlphabet)}, s.params.stop.min_tokens = 3;
    if (i % 4 == 3) s.stop_sequence = {letter((group + 45) % quickstart::kAlphabet), letter((group + 46) % quickstart::kAlphabet)};
    out.push_back(s);
  }
  return out;
}

// One sequence's whole output; compared as bits.
struct Output {
  Tokens tokens;
  std::vector<uint32_t> logprobs;                         // bits
  std::vector<std::vector<std::pair<int32_t, uint32_t>>> tops;  // (token, logprob bits)
  FinishReason finish = FinishReason::none;
  bool by_stop_sequence = false;
  bool operator==(const Output&) const = default;
};
using Outputs = std::vector<std::vector<Output>>;  // [request][sequence]

struct RunStats {
  int64_t preemptions = 0, prefix_hit_tokens = 0;
  double seconds = 0;
};

bool ends_with(const Tokens& t, const Tokens& tail) {
  return !tail.empty() && t.size() >= tail.size() && std::equal(tail.begin(), tail.end(), t.end() - tail.size());
}

Outputs run(const std::vector<Spec>& sp, const EngineConfig& config, bool one_at_a_time, RunStats& stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const quickstart::Trained& m = quickstart::trained();
  Pools pools;
  Engine engine(m.cfg, m.params, pools, config);
  Outputs out(sp.size());
  std::map<RequestId, size_t> which;
  auto add = [&](size_t i) {
    which[engine.add_request(sp[i].prompt, sp[i].params)] = i;
    out[i].resize(static_cast<size_t>(sp[i].params.n));
  };
  auto drain = [&] {
    while (engine.has_unfinished()) {
      for (const TokenEvent& e : engine.step()) {
        const size_t i = which.at(e.request);
        Output& o = out[i].at(static_cast<size_t>(e.index));
        EXPECT_EQ(o.finish, FinishReason::none) << "request " << i << " sequence " << e.index << ": a token after its end";
        o.tokens.push_back(e.token);
        o.logprobs.push_back(std::bit_cast<uint32_t>(e.logprob));
        o.tops.emplace_back();
        for (const TokenLogprob& a : e.top) o.tops.back().emplace_back(a.token, std::bit_cast<uint32_t>(a.logprob));
        o.finish = e.finish;
        if (e.finish == FinishReason::none && ends_with(o.tokens, sp[i].stop_sequence)) {
          EXPECT_TRUE(engine.finish_sequence(e.request, e.index, FinishReason::stop));
          o.finish = FinishReason::stop;
          o.by_stop_sequence = true;
        }
      }
    }
  };
  if (one_at_a_time) {
    for (size_t i = 0; i < sp.size(); ++i) add(i), drain();
  } else {
    for (size_t i = 0; i < sp.size(); ++i) add(i);
    drain();
  }
  // The KV cache is empty: every block free, the pool's invariants hold.
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(engine.kv().pool().num_used(), 0);
  engine.kv().pool().check_invariants();
  stats.preemptions = engine.scheduler().stats().num_preemptions;
  stats.prefix_hit_tokens = engine.kv().stats().prefix_hit_tokens;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// The first difference between two runs' outputs, or "".
std::string first_difference(const Outputs& a, const Outputs& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return "request " + std::to_string(i) + ": sequence counts differ";
    for (size_t k = 0; k < a[i].size(); ++k) {
      const Output &x = a[i][k], &y = b[i][k];
      if (x == y) continue;
      std::string what = "request " + std::to_string(i) + " sequence " + std::to_string(k) + ": ";
      if (x.tokens != y.tokens) return what + "tokens differ";
      if (x.logprobs != y.logprobs) return what + "log-probabilities differ";
      if (x.tops != y.tops) return what + "top log-probabilities differ";
      return what + "finish reasons differ (" + finish_reason_name(x.finish) + " vs " + finish_reason_name(y.finish) + ")";
    }
  }
  return "";
}

EngineConfig config(int64_t budget, int64_t num_blocks = 0) {
  return {.num_blocks = num_blocks, .block_size = kBlockSize, .max_num_batched_tokens = budget, .max_num_seqs = 256};
}

TEST(EngineDeterminism, SixtyFourRequestsGiveTheSameBitsAloneBatchedPreemptedAndChunked) {
  const std::vector<Spec> sp = specs();
  RunStats alone_stats;
  const Outputs alone = run(sp, config(256), true, alone_stats);

  // The reference run exercises what it should: every finish reason the
  // requests can reach, siblings that differ, prefix-cache hits.
  int64_t sequences = 0, by_length = 0, by_stop = 0, by_sequence = 0, differing_siblings = 0;
  for (size_t i = 0; i < alone.size(); ++i) {
    for (const Output& o : alone[i]) {
      ++sequences;
      by_length += o.finish == FinishReason::length;
      by_stop += o.finish == FinishReason::stop && !o.by_stop_sequence;
      by_sequence += o.by_stop_sequence;
      EXPECT_NE(o.finish, FinishReason::none);
    }
    for (size_t k = 1; k < alone[i].size(); ++k) differing_siblings += alone[i][k].tokens != alone[i][0].tokens;
  }
  std::printf("reference: %lld sequences: %lld length, %lld stop/eos token, %lld stop sequence; %lld siblings "
              "differ from their first; %lld prefix-cache hit tokens; %.2f s\n",
              static_cast<long long>(sequences), static_cast<long long>(by_length), static_cast<long long>(by_stop),
              static_cast<long long>(by_sequence), static_cast<long long>(differing_siblings),
              static_cast<long long>(alone_stats.prefix_hit_tokens), alone_stats.seconds);
  EXPECT_GT(by_length, 0);
  EXPECT_GT(by_stop, 0);
  EXPECT_GT(by_sequence, 0);
  EXPECT_GT(differing_siblings, 0);
  EXPECT_GT(alone_stats.prefix_hit_tokens, 0);

  struct Case {
    const char* name;
    EngineConfig c;
  };
  // (c): 1 + 8 blocks hold one sequence of max_model_len 128; 4 more leave
  // room for a few of the ~100 sequences at a time.
  const Case cases[] = {
      {"all 64 at once", config(256)},
      {"all at once, preempted", config(64, 1 + 8 + 4)},
      {"all at once, 1 token a step", config(1)},
      {"all at once, 7 tokens a step", config(7)},
      {"all at once, 64 tokens a step", config(64)},
  };
  for (const Case& c : cases) {
    RunStats stats;
    const Outputs got = run(sp, c.c, false, stats);
    std::printf("%s: %.2f s, %lld preemptions, %lld prefix-cache hit tokens\n", c.name, stats.seconds,
                static_cast<long long>(stats.preemptions), static_cast<long long>(stats.prefix_hit_tokens));
    EXPECT_EQ(first_difference(alone, got), "") << c.name;
    if (c.c.num_blocks > 0) {
      EXPECT_GT(stats.preemptions, 0) << c.name << " was meant to preempt";
    }
  }
}

// The same bits on every CPU (DESIGN.md §8, §1.9): the 64 requests, all at
// once, give the very same f32 tokens and log-probabilities at every
// instruction-set level this CPU can run (cpu_isa.h): the generic, AVX2 and
// AVX-512 kernels keep one arithmetic per result (16 lanes in a fixed order,
// fused multiply-adds where the reference path fuses, one lane-sum tree).
// So a request answered on an AVX2 laptop and on an AVX-512 server agrees.
TEST(EngineDeterminism, EveryInstructionSetLevelGivesTheSameF32Bits) {
  using kernels::CpuIsa;
  const CpuIsa before = kernels::cpu_isa();
  const std::vector<Spec> sp = specs();
  quickstart::trained();  // trained once, at the level the run started with
  RunStats stats;
  const Outputs best = run(sp, config(256), false, stats);
  std::printf("%s: %.2f s\n", kernels::cpu_isa_name(before), stats.seconds);
  for (const CpuIsa level : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16, CpuIsa::amx}) {
    if (static_cast<int>(level) > static_cast<int>(kernels::cpu_isa_supported())) {
      std::printf("%s: not on this CPU (it has up to %s)\n", kernels::cpu_isa_name(level),
                  kernels::cpu_isa_name(kernels::cpu_isa_supported()));
      continue;
    }
    kernels::set_cpu_isa(level);
    const Outputs got = run(sp, config(256), false, stats);
    std::printf("%s: %.2f s\n", kernels::cpu_isa_name(level), stats.seconds);
    EXPECT_EQ(first_difference(best, got), "") << kernels::cpu_isa_name(level) << " vs " << kernels::cpu_isa_name(before);
  }
  kernels::set_cpu_isa(before);
}

// sample_rows (the engine's step) gives every row exactly what sample_at
// gives it alone, whatever rows surround it and however many there are.
TEST(SamplerBatchInvariance, EveryRowOfSampleRowsEqualsSampleAtAlone) {
  constexpr int64_t V = 50257, kPool = 64;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> logits(static_cast<size_t>(kPool * V));
  for (float& x : logits) x = 3.f * normal(rng);
  std::vector<SamplerConfig> cfgs;
  std::vector<Tokens> prompts, outputs;
  std::vector<uint64_t> draws;
  std::vector<int64_t> tops;
  const std::vector<Spec> sp = specs();
  for (int64_t r = 0; r < kPool; ++r) {
    cfgs.push_back(sp[static_cast<size_t>(r)].params.sampler);
    prompts.push_back(sp[static_cast<size_t>(r)].prompt);
    Tokens o;
    for (int64_t k = 0; k < r % 9; ++k) o.push_back(static_cast<int32_t>((r * 31 + k * 977) % V));
    outputs.push_back(o);
    draws.push_back(static_cast<uint64_t>(o.size()));
    tops.push_back(sp[static_cast<size_t>(r)].params.top_logprobs);
  }
  auto row = [&](int64_t r) { return std::span<const float>(logits).subspan(static_cast<size_t>(r * V), V); };
  std::vector<SampleResult> alone;
  for (int64_t r = 0; r < kPool; ++r)
    alone.push_back(sample_at(cfgs[r], row(r), prompts[r], outputs[r], draws[r], tops[r]));
  auto same = [](const SampleResult& a, const SampleResult& b) {
    if (a.token != b.token || std::bit_cast<uint32_t>(a.logprob) != std::bit_cast<uint32_t>(b.logprob)) return false;
    if (a.top.size() != b.top.size()) return false;
    for (size_t k = 0; k < a.top.size(); ++k)
      if (a.top[k].token != b.top[k].token ||
          std::bit_cast<uint32_t>(a.top[k].logprob) != std::bit_cast<uint32_t>(b.top[k].logprob))
        return false;
    return true;
  };
  for (int64_t R : {1, 2, 3, 7, 17, 64}) {
    std::vector<int64_t> idx(static_cast<size_t>(kPool));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), std::mt19937(static_cast<uint32_t>(R)));
    idx.resize(static_cast<size_t>(R));
    std::vector<float> batch;
    std::vector<SamplerConfig> c;
    std::vector<std::span<const int32_t>> p, o;
    std::vector<uint64_t> d;
    std::vector<int64_t> t;
    for (int64_t r : idx) {
      batch.insert(batch.end(), row(r).begin(), row(r).end());
      c.push_back(cfgs[r]), p.emplace_back(prompts[r]), o.emplace_back(outputs[r]), d.push_back(draws[r]);
      t.push_back(tops[r]);
    }
    const std::vector<SampleResult> got = sample_rows(batch, V, c, p, o, d, t);
    ASSERT_EQ(got.size(), idx.size());
    for (size_t k = 0; k < idx.size(); ++k)
      EXPECT_TRUE(same(got[k], alone[static_cast<size_t>(idx[k])])) << "R " << R << ": row " << idx[k] << " at " << k;
  }
}

}  // namespace
}  // namespace loom::infer
