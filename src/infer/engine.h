// Engine: the serving loop's core (DESIGN.md §8), driven by one thread (the
// server's engine loop, `loom generate`): requests in, one scheduled step at
// a time, sampled tokens out. It ties the scheduler and KV cache manager
// (bookkeeping), the paged runner (one ragged forward per step) and the
// sampler (per request, keyed by output position, so a request's tokens do
// not depend on what else runs, on chunking or on preemption).
//
//   Engine engine(cfg, params, pools, {...});
//   RequestId id = engine.add_request(prompt, params);
//   while (engine.has_unfinished())
//     for (const TokenEvent& e : engine.step()) ...;   // stream e.token
//
// n > 1: the prompt is computed once; when its first token is sampled the
// request forks into n sequences sharing every KV block (copy-on-write), each
// sampling with its own seed; events name the sequence and its index. The
// sequences count against max_num_seqs: those that do not fit wait, and
// sample the same tokens when they run (fork_siblings).
//
// min_tokens: until a sequence has that many tokens, its EOS and stop tokens
// are never sampled (their logits -inf, as vLLM's MinTokensLogitsProcessor);
// the logprobs reported stay the model's own (vLLM's raw_logprobs).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/memory.h"
#include "infer/kv_cache_manager.h"
#include "infer/request.h"
#include "infer/sampler.h"
#include "infer/scheduler.h"
#include "infer/token_grammar.h"
#include "model/config.h"
#include "infer/model_runner.h"

namespace loom::infer {

// The largest KV cache block (tokens; --block-size): a block past any
// context is memory no sequence uses (vLLM's largest is 256).
inline constexpr int64_t kMaxBlockSize = 65536;

struct EngineConfig {
  // The KV cache: num_blocks blocks (with the null block) if > 0, else as
  // many as kv_cache_bytes holds if > 0, else enough for max_num_seqs
  // sequences of max_model_len tokens, but no more than
  // kv_memory_limit_bytes holds when that is > 0 and holds one such
  // sequence. It must hold one max_model_len sequence (a request can always
  // run alone). The one place the KV cache is sized (resolved: config()).
  int64_t num_blocks = 0;
  int64_t kv_cache_bytes = 0;
  int64_t kv_memory_limit_bytes = 0;
  int64_t block_size = 16;
  DType kv_dtype = DType::f32;
  int64_t max_num_batched_tokens = 256;
  int64_t max_num_seqs = 16;
  int64_t max_model_len = 0;  // 0: the model's max_seq_len
  bool chunked_prefill = true;
  bool prefix_caching = true;
  // Batch-invariant linears (model::PagedRunnerSizes): a request's tokens do
  // not depend on its batch. Off trades that for oneDNN's faster GEMM at
  // many rows (measured in BENCHMARKS.md).
  bool batch_invariant = true;
};

// An embedding request's pooling (GenerationParams::pooling): the final
// hidden states (after the last norm) of every prompt token averaged, or
// the last token's. Such a request computes its prompt and ends: no token
// is sampled.
enum class Pooling : uint8_t { none, mean, last };
const char* pooling_name(Pooling p);

// The config an engine runs with: max_model_len and the KV cache's blocks
// resolved by the rules above; loom::Error naming what is invalid.
EngineConfig resolve_engine_config(EngineConfig c, const model::ModelConfig& cfg);

struct GenerationParams {
  SamplerConfig sampler{};
  StopParams stop{};
  int64_t n = 1;             // sequences from one prompt
  int64_t top_logprobs = 0;  // alternatives reported per token
  // Constrained decoding (token_grammar.h): every sequence's output follows
  // this grammar; null: none. Needs an end token (EOS, not ignored, or a stop token).
  std::shared_ptr<const TokenGrammar> grammar{};
  // Not none: an embedding (n 1, no grammar, no logprobs); the request ends
  // with one TokenEvent carrying it (token -1, finish stop). Mean pooling
  // computes every prompt token (the prefix cache is not read for it).
  Pooling pooling = Pooling::none;
  // The LoRA adapter the request runs with (Engine::add_adapter's id; 0:
  // the base alone). Its KV blocks are its own: the prefix cache never
  // gives one adapter's blocks to a request of another.
  int32_t adapter = 0;
  void validate() const;     // loom::Error naming the field
};

// One sampled token of one sequence.
struct TokenEvent {
  RequestId request = 0;  // what add_request returned
  int64_t index = 0;      // which of its n sequences
  int32_t token = 0;
  float logprob = 0.f;
  std::vector<TokenLogprob> top;
  FinishReason finish = FinishReason::none;  // none: more to come for this sequence
  std::vector<float> embedding;  // a pooling request's result (its only event), (n_embd) f32
};

struct GenerationOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::none;
};

class Engine {
 public:
  // params: (P) per param_specs(cfg), f32, bf16 or f16 (the dtype the model
  // computes in); must outlive the engine. quant: the linears served in their
  // quantized blocks (model/quant_weights.h; params f32), or null; must
  // outlive the engine too.
  Engine(const model::ModelConfig& cfg, const Tensor& params, Pools& pools, const EngineConfig& config,
         const model::QuantWeights* quant = nullptr);
  // An engine over another runner (a test's, a device's): its KV cache must
  // hold config.num_blocks blocks of config.block_size tokens (num_blocks is
  // required here), and fingerprint roots the prefix cache's hashes (the
  // weights' identity: blocks of other weights must never match).
  Engine(std::unique_ptr<ModelRunner> runner, const EngineConfig& config, BlockHash fingerprint);

  // A LoRA adapter (model/lora.h) requests may run with, unmerged, beside
  // the base and each other in the same steps (GenerationParams::adapter):
  // adapters (lora_param_count) f32 in lora_param_specs order, copied.
  // Returns its id, 1, 2, ...; the runner's loom::Error for adapters the
  // model cannot carry. Between steps only.
  int32_t add_adapter(const model::LoraConfig& lora, const Tensor& adapters);
  int32_t num_adapters() const { return static_cast<int32_t>(adapter_keys_.size()); }

  // Queues a request; loom::Error (nothing queued) for invalid params, an
  // empty prompt, a token outside the vocabulary or a prompt that leaves no
  // room within max_model_len.
  RequestId add_request(std::vector<int32_t> prompt, const GenerationParams& params);
  // One step: schedules, runs the forward, samples; the new token of every
  // sequence that got one.
  std::vector<TokenEvent> step();
  // Ends every sequence of a request now (a client gone: abort; a stop
  // string the caller matched: stop). False if none was left.
  bool finish(RequestId request, FinishReason reason);
  // finish(request, abort): a client gone. Frees every block at once.
  bool abort(RequestId request) { return finish(request, FinishReason::abort); }
  // Ends sequence `index` of a request only (n > 1: one sequence matched a
  // stop string); its siblings go on. False if it was not running.
  bool finish_sequence(RequestId request, int64_t index, FinishReason reason);
  bool has_unfinished() const { return scheduler_.has_unfinished(); }
  // Runs prompts to completion: outputs[i][k] is sequence k of prompt i.
  std::vector<std::vector<GenerationOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                                      const GenerationParams& params);
  // Runs prompts to their pooled hidden states: one (n_embd) vector each.
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>>& prompts, Pooling pooling);

  const Scheduler& scheduler() const { return scheduler_; }
  const KvCacheManager& kv() const { return kv_; }
  const ModelRunner& runner() const { return *runner_; }
  const EngineConfig& config() const { return config_; }  // resolved: num_blocks and max_model_len set

 private:
  struct Sequence {
    RequestId request = 0;
    int64_t index = 0;
    GenerationParams params;
    bool forked = false;  // n > 1: its siblings exist
    std::shared_ptr<SequenceGrammar> grammar{};  // params.grammar's state for this sequence
    std::vector<double> pooled{};  // pooling mean: the hidden rows computed so far, summed in row order
  };
  Sequence new_sequence(RequestId request, int64_t index, const GenerationParams& params, bool forked) const;
  std::vector<RequestId> fork_siblings(RequestId id);  // the children that run now
  std::vector<TokenEvent> sample(const SchedulerOutput& out, const Tensor& logits);
  void pool(const SchedulerOutput& out, const Tensor& hidden, std::vector<TokenEvent>& events);

  model::ModelConfig cfg_;
  EngineConfig config_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<RequestId, Sequence> sequences_;  // by the scheduler's id of the sequence
  RequestId next_id_ = 1;
  std::vector<uint64_t> adapter_keys_;  // by id - 1: the adapter's weights' digest, its requests' extra_keys
};

}  // namespace loom::infer
