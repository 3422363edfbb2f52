#include "infer/engine.h"

#include <algorithm>
#include <array>
#include <map>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/sha256.h"
#include "model/params.h"
#include "model/quant_weights.h"

namespace loom::infer {

namespace {

int64_t model_len(const EngineConfig& c, const model::ModelConfig& cfg) {
  LOOM_REQUIRE(c.max_model_len >= 0 && c.max_model_len <= cfg.max_seq_len, "max_model_len ", c.max_model_len,
               " is invalid: allowed 1 to model.max_seq_len = ", cfg.max_seq_len, " (0: max_seq_len)");
  return c.max_model_len > 0 ? c.max_model_len : cfg.max_seq_len;
}

}  // namespace

EngineConfig resolve_engine_config(EngineConfig c, const model::ModelConfig& cfg) {
  c.max_model_len = model_len(c, cfg);
  LOOM_REQUIRE(c.block_size >= 1 && c.block_size <= kMaxBlockSize, "KV block size ", c.block_size,
               " is invalid: allowed 1 to ", kMaxBlockSize, " tokens");
  LOOM_REQUIRE(c.max_num_seqs >= 1, "max_num_seqs ", c.max_num_seqs, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(c.num_blocks >= 0 && c.kv_cache_bytes >= 0, "KV cache size is invalid: ", c.num_blocks,
               " blocks, ", c.kv_cache_bytes, " bytes; allowed values are >= 0 (0: the default)");
  const int64_t per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;  // blocks of one full sequence
  const int64_t block_bytes = model::kv_block_bytes(cfg, c.block_size, c.kv_dtype);
  if (c.num_blocks == 0 && c.kv_cache_bytes > 0) {
    c.num_blocks = c.kv_cache_bytes / block_bytes;
    LOOM_REQUIRE(c.num_blocks >= 1 + per_seq, "a KV cache of ", c.kv_cache_bytes / double(1 << 20), " MiB holds ",
                 c.num_blocks, " blocks of ", c.block_size, " tokens (", block_bytes,
                 " bytes each, null block included); one sequence of max_model_len = ", c.max_model_len,
                 " tokens needs ", 1 + per_seq, " (", (1 + per_seq) * block_bytes / double(1 << 20),
                 " MiB): give more KV cache memory or a shorter max_model_len");
  }
  if (c.num_blocks == 0) {
    const int64_t want = 1 + c.max_num_seqs * per_seq;
    const int64_t share = c.kv_memory_limit_bytes > 0 ? c.kv_memory_limit_bytes / block_bytes : 0;
    c.num_blocks = share > per_seq ? std::min(want, share) : want;  // a limit too small for one sequence: ignored
  }
  return c;
}

namespace {

// The root of every prefix-cache hash: a digest of the weights' bytes, so
// blocks computed by other weights can never match. With quantized weights:
// of the parameters they do not stand for (their place in params is never
// written), then of their blocks. The bytes are cut into pieces of at most
// kFingerprintPiece, hashed in parallel (SHA-256 is sequential: one thread
// took ~10 s for a 4.7 GB f32 model before its first token), and the root is
// the SHA-256 of the pieces' digests in order.
constexpr size_t kFingerprintPiece = size_t{16} << 20;

BlockHash weights_fingerprint(const model::ModelConfig& cfg, const Tensor& params, const model::QuantWeights* quant) {
  const auto* bytes = static_cast<const uint8_t*>(params.data());
  std::vector<std::span<const uint8_t>> parts;
  if (quant == nullptr || quant->empty()) {
    parts.emplace_back(bytes, static_cast<size_t>(params.nbytes()));
  } else {
    const size_t elem = dtype_size(params.dtype());
    for (const model::ParamSpec& s : model::param_specs(cfg))
      if (!quant->holds(s.name))
        parts.emplace_back(bytes + static_cast<size_t>(s.offset) * elem, static_cast<size_t>(s.numel()) * elem);
    for (const std::string& name : quant->names()) {
      const Tensor& b = quant->blocks(name);
      parts.emplace_back(static_cast<const uint8_t*>(b.data()), static_cast<size_t>(b.nbytes()));
    }
  }
  std::vector<std::span<const uint8_t>> pieces;
  for (std::span<const uint8_t> part : parts)
    for (size_t at = 0; at < part.size(); at += kFingerprintPiece)
      pieces.push_back(part.subspan(at, std::min(kFingerprintPiece, part.size() - at)));
  std::vector<std::array<uint8_t, 32>> digests(pieces.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < pieces.size(); ++i) {
    Sha256 sha;
    sha.update(pieces[i].data(), pieces[i].size());
    digests[i] = sha.finish();
  }
  Sha256 root;
  for (const std::array<uint8_t, 32>& d : digests) root.update(d.data(), d.size());
  const std::array<uint8_t, 32> digest = root.finish();
  return sha256_128(digest);
}

const model::ModelConfig& runner_config(const std::unique_ptr<ModelRunner>& runner, const EngineConfig& c) {
  LOOM_REQUIRE(runner != nullptr && c.num_blocks > 0,
               "an engine over a runner of its own needs the runner and the number of blocks its KV cache holds");
  return runner->config();
}

// The paged runner's sizes for an engine's (resolved) config: every row of
// a step may want its logits (a step of decodes only).
model::PagedRunnerSizes runner_sizes(const EngineConfig& c) {
  return {.num_blocks = c.num_blocks,
          .block_size = c.block_size,
          .max_tokens = c.max_num_batched_tokens,
          .max_logit_rows = c.max_num_batched_tokens,
          .kv_dtype = c.kv_dtype,
          .batch_invariant = c.batch_invariant};
}

// Sequence k of a request draws from its own stream.
uint64_t sequence_seed(uint64_t seed, int64_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// What min_tokens keeps from being sampled: vLLM's all_stop_token_ids, the
// stop tokens and EOS (even ignored: vLLM adds the model's EOS regardless).
std::vector<int32_t> stop_tokens(const StopParams& stop) {
  std::vector<int32_t> ids = stop.stop_token_ids;
  ids.insert(ids.end(), stop.eos_token_ids.begin(), stop.eos_token_ids.end());
  return ids;
}

}  // namespace

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::none: return "none";
    case Pooling::mean: return "mean";
    case Pooling::last: return "last";
  }
  return "?";
}

void GenerationParams::validate() const {
  sampler.validate();
  stop.validate();
  LOOM_REQUIRE(n >= 1, "n = ", n, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(top_logprobs >= 0 && top_logprobs <= 20, "top_logprobs = ", top_logprobs,
               " is invalid: allowed 0 to 20");
  LOOM_REQUIRE(grammar == nullptr || (grammar->grammar != nullptr && grammar->vocab != nullptr),
               "a grammar needs its rules and the model's vocabulary");
  LOOM_REQUIRE(grammar == nullptr || !stop.stop_token_ids.empty() || (!stop.eos_token_ids.empty() && !stop.ignore_eos),
               "a grammar needs a token that ends the output: EOS (not ignored) or a stop token");
  LOOM_REQUIRE(pooling == Pooling::none || (n == 1 && grammar == nullptr && top_logprobs == 0),
               "an embedding (pooling ", pooling_name(pooling), ") samples nothing: it takes n = 1, no grammar ",
               "and no logprobs");
}

Engine::Engine(const model::ModelConfig& cfg, const Tensor& params, Pools& pools, const EngineConfig& config,
               const model::QuantWeights* quant)
    : Engine(std::make_unique<PagedModelRunner>(cfg, params, pools, runner_sizes(resolve_engine_config(config, cfg)), quant),
             resolve_engine_config(config, cfg), weights_fingerprint(cfg, params, quant)) {}

Engine::Engine(std::unique_ptr<ModelRunner> runner, const EngineConfig& config, BlockHash fingerprint)
    : cfg_(runner_config(runner, config)),
      config_(resolve_engine_config(config, cfg_)),
      kv_(KvCacheConfig{.num_blocks = config_.num_blocks,
                        .block_size = config_.block_size,
                        .seed = fingerprint,
                        .enable_prefix_caching = config_.prefix_caching}),
      scheduler_(SchedulerConfig{.max_num_batched_tokens = config_.max_num_batched_tokens,
                                 .max_num_seqs = config_.max_num_seqs,
                                 .max_model_len = config_.max_model_len,
                                 .chunked_prefill = config_.chunked_prefill},
                 kv_),
      runner_(std::move(runner)) {}

int32_t ModelRunner::add_adapter(const model::LoraConfig&, const Tensor&) {
  fail("this model runner serves no LoRA adapters");
}

int32_t Engine::add_adapter(const model::LoraConfig& lora, const Tensor& adapters) {
  const int32_t id = runner_->add_adapter(lora, adapters);
  LOOM_CHECK(id == num_adapters() + 1, "Engine::add_adapter: the runner gave id ", id, " after ", num_adapters());
  // Its requests' blocks hash under the adapter's identity (its weights and
  // scale): two adapters' blocks never match, the same adapter's always do.
  Sha256 sha;
  sha.update(static_cast<const uint8_t*>(adapters.data()), static_cast<size_t>(adapters.nbytes()));
  const float scale = lora.scale();
  sha.update(reinterpret_cast<const uint8_t*>(&scale), sizeof scale);
  const std::array<uint8_t, 32> digest = sha.finish();
  adapter_keys_.push_back(sha256_128(digest).lo);
  return id;
}

RequestId Engine::add_request(std::vector<int32_t> prompt, const GenerationParams& params) {
  params.validate();
  LOOM_REQUIRE(params.adapter >= 0 && params.adapter <= num_adapters(), "adapter ", params.adapter,
               " is invalid: the engine has ", num_adapters(), " (ids 1 to ", num_adapters(), "; 0: the base)");
  check_prompt(prompt, cfg_.vocab_size, config_.max_model_len);
  LOOM_REQUIRE(params.grammar == nullptr || params.grammar->vocab->size() == cfg_.vocab_size,
               "the grammar's vocabulary has ", params.grammar ? params.grammar->vocab->size() : 0,
               " tokens, the model's ", cfg_.vocab_size);
  const RequestId id = next_id_;
  std::vector<uint64_t> keys;
  if (params.adapter > 0) keys.push_back(adapter_keys_[static_cast<size_t>(params.adapter - 1)]);
  scheduler_.add_request(id, std::move(prompt), params.stop, std::move(keys), params.pooling != Pooling::mean);
  ++next_id_;
  sequences_[id] = new_sequence(id, 0, params, false);
  return id;
}

Engine::Sequence Engine::new_sequence(RequestId request, int64_t index, const GenerationParams& params,
                                      bool forked) const {
  Sequence s{request, index, params, forked};
  if (params.grammar) {
    std::vector<int32_t> end = params.stop.stop_token_ids;
    if (!params.stop.ignore_eos) end.insert(end.end(), params.stop.eos_token_ids.begin(), params.stop.eos_token_ids.end());
    s.grammar = std::make_shared<SequenceGrammar>(*params.grammar, std::move(end));
  }
  return s;
}

std::vector<TokenEvent> Engine::step() {
  const SchedulerOutput out = scheduler_.schedule();
  if (out.scheduled.empty()) return {};
  std::vector<std::pair<int32_t, int32_t>> copies;
  for (const BlockCopy& c : out.copies) copies.emplace_back(c.src, c.dst);
  runner_->copy_blocks(copies);
  std::vector<int32_t> tokens, positions, query_start{0}, seq_lens, tables, logit_rows, hidden_rows, adapters;
  std::vector<int64_t> slots;
  int64_t max_blocks = 1;
  for (const ScheduledRequest& s : out.scheduled) max_blocks = std::max<int64_t>(max_blocks, kv_.block_table(s.id).size());
  for (const ScheduledRequest& s : out.scheduled) {
    const Request& r = scheduler_.request(s.id);
    for (int64_t p = s.first_position; p < s.first_position + s.num_tokens; ++p) {
      tokens.push_back(r.tokens[static_cast<size_t>(p)]);
      positions.push_back(static_cast<int32_t>(p));
    }
    const std::vector<int64_t> sl = kv_.slot_mapping(s.id, s.first_position, s.num_tokens);
    slots.insert(slots.end(), sl.begin(), sl.end());
    query_start.push_back(static_cast<int32_t>(tokens.size()));
    seq_lens.push_back(static_cast<int32_t>(s.first_position + s.num_tokens));
    const std::span<const BlockId> table = kv_.block_table(s.id);
    tables.insert(tables.end(), table.begin(), table.end());
    tables.resize(tables.size() + static_cast<size_t>(max_blocks) - table.size(), -1);
    const Pooling pooling = sequences_.at(s.id).params.pooling;
    adapters.push_back(sequences_.at(s.id).params.adapter);
    const auto end = static_cast<int32_t>(tokens.size());
    if (pooling == Pooling::mean)
      for (int32_t row = end - static_cast<int32_t>(s.num_tokens); row < end; ++row) hidden_rows.push_back(row);
    if (s.samples && pooling == Pooling::last) hidden_rows.push_back(end - 1);
    if (s.samples && pooling == Pooling::none) logit_rows.push_back(end - 1);
  }
  for (RequestId id : out.preempted)  // computed again from the start
    if (auto it = sequences_.find(id); it != sequences_.end()) it->second.pooled.clear();
  const Tensor logits = runner_->step(
      {tokens, positions, slots, query_start, seq_lens, tables, max_blocks, logit_rows, hidden_rows, adapters});
  std::vector<TokenEvent> events = sample(out, logits);
  if (!hidden_rows.empty()) pool(out, runner_->hidden(), events);
  return events;
}

// The pooling requests' hidden rows, in the order step() asked for them:
// a mean's are summed (row by row, so chunking cannot change the sum); a
// request whose prompt is now computed ends with its embedding.
void Engine::pool(const SchedulerOutput& out, const Tensor& hidden, std::vector<TokenEvent>& events) {
  const int64_t C = cfg_.n_embd;
  const float* row = hidden.data_as<float>();
  for (const ScheduledRequest& s : out.scheduled) {
    const auto it = sequences_.find(s.id);  // a generation may have ended in sample()
    if (it == sequences_.end() || it->second.params.pooling == Pooling::none) continue;
    Sequence& seq = it->second;
    std::vector<float> embedding;
    if (seq.params.pooling == Pooling::mean) {
      seq.pooled.resize(static_cast<size_t>(C), 0.0);
      for (int64_t r = 0; r < s.num_tokens; ++r, row += C)
        for (int64_t c = 0; c < C; ++c) seq.pooled[static_cast<size_t>(c)] += row[c];
      if (!s.samples) continue;
      const auto count = static_cast<double>(scheduler_.request(s.id).num_prompt_tokens);
      for (double v : seq.pooled) embedding.push_back(static_cast<float>(v / count));
    } else {
      if (!s.samples) continue;
      embedding.assign(row, row + C);
      row += C;
    }
    events.push_back({.request = seq.request, .index = 0, .token = -1, .top = {}, .finish = FinishReason::stop,
                      .embedding = std::move(embedding)});
    scheduler_.finish(s.id, FinishReason::stop);
    sequences_.erase(s.id);
  }
}

// n > 1 never runs more than max_num_seqs sequences: the children that fit
// run at once and sample from the parent's logits row; the rest wait in the
// queue (Scheduler::fork) and, admitted as a slot frees, compute their
// prompt's last token again (its other blocks from the prefix cache) and
// sample from their own row. That row is bitwise the parent's (the runner is
// batch- and chunk-invariant, as after a preemption) and a child's draw
// depends only on its seed, index and position: a child that waited samples
// the tokens it would have sampled at once.
std::vector<RequestId> Engine::fork_siblings(RequestId id) {
  Sequence& parent = sequences_.at(id);
  parent.forked = true;
  const RequestId request = parent.request;
  const GenerationParams params = parent.params;  // parent may move: sequences_ grows below
  std::vector<RequestId> children;
  for (int64_t k = 1; k < params.n; ++k) {
    children.push_back(next_id_++);
    sequences_[children.back()] = new_sequence(request, k, params, true);
  }
  children.resize(static_cast<size_t>(scheduler_.fork(id, children)));
  return children;
}

std::vector<TokenEvent> Engine::sample(const SchedulerOutput& out, const Tensor& logits) {
  const int64_t V = cfg_.vocab_size;
  std::vector<std::pair<RequestId, int64_t>> rows;  // (sequence, its logits row)
  int64_t next_row = 0;  // one logits row per sampling request; a forking one feeds all its children from it
  for (const ScheduledRequest& s : out.scheduled) {
    if (!s.samples || sequences_.at(s.id).params.pooling != Pooling::none) continue;
    const int64_t row = next_row++;
    const Sequence& seq = sequences_.at(s.id);
    const bool first_token = scheduler_.request(s.id).num_output_tokens() == 0;
    if (seq.params.n > 1 && !seq.forked && first_token) {
      rows.emplace_back(s.id, row);
      for (RequestId c : fork_siblings(s.id)) rows.emplace_back(c, row);
    } else {
      rows.emplace_back(s.id, row);
    }
  }
  std::vector<SampleRow> draws;
  const float* base = logits.data_as<float>();
  for (const auto& [id, row] : rows) {
    const Sequence& seq = sequences_.at(id);
    const Request& r = scheduler_.request(id);
    SamplerConfig cfg = seq.params.sampler;
    cfg.seed = sequence_seed(cfg.seed, seq.index);
    const std::span<const int32_t> all(r.tokens);
    draws.push_back({cfg, std::span<const float>(base + row * V, V), all.first(r.num_prompt_tokens),
                     all.subspan(r.num_prompt_tokens), static_cast<uint64_t>(r.num_output_tokens()),
                     seq.params.top_logprobs});
    if (seq.grammar)  // the constrained rows' masks, walked in the rows' parallel loop
      draws.back().allowed_of = [g = seq.grammar.get()](std::vector<uint8_t>& mask) { g->allowed(mask); };
    if (r.num_output_tokens() < seq.params.stop.min_tokens) draws.back().banned = stop_tokens(seq.params.stop);
  }
  std::vector<SampleResult> results;
  try {
    results = sample_rows(draws);
  } catch (const Error& e) {
    fail("sampling: ", e.what());
  }
  for (size_t i = 0; i < rows.size(); ++i)
    if (const Sequence& seq = sequences_.at(rows[i].first); seq.grammar) seq.grammar->accept(results[i].token);
  std::vector<SampledToken> sampled;
  for (size_t i = 0; i < rows.size(); ++i) sampled.push_back({rows[i].first, results[i].token});
  const std::vector<TokenUpdate> updates = scheduler_.update(sampled);
  LOOM_CHECK(updates.size() == rows.size(), "engine: ", updates.size(), " updates for ", rows.size(), " tokens");
  std::vector<TokenEvent> events;
  for (size_t i = 0; i < updates.size(); ++i) {
    const Sequence& seq = sequences_.at(updates[i].id);
    events.push_back({seq.request, seq.index, updates[i].token, results[i].logprob, std::move(results[i].top),
                      updates[i].finish, {}});
    if (updates[i].finish != FinishReason::none) sequences_.erase(updates[i].id);
  }
  return events;
}

bool Engine::finish(RequestId request, FinishReason reason) {
  bool any = false;
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (it->second.request == request) {
      any |= scheduler_.finish(it->first, reason);
      it = sequences_.erase(it);
    } else {
      ++it;
    }
  }
  return any;
}

bool Engine::finish_sequence(RequestId request, int64_t index, FinishReason reason) {
  for (auto it = sequences_.begin(); it != sequences_.end(); ++it) {
    if (it->second.request != request || it->second.index != index) continue;
    const bool any = scheduler_.finish(it->first, reason);
    sequences_.erase(it);
    return any;
  }
  return false;
}

std::vector<std::vector<GenerationOutput>> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                            const GenerationParams& params) {
  std::map<RequestId, size_t> which;
  std::vector<std::vector<GenerationOutput>> outputs(prompts.size(),
                                                     std::vector<GenerationOutput>(static_cast<size_t>(params.n)));
  for (size_t i = 0; i < prompts.size(); ++i) which[add_request(prompts[i], params)] = i;
  while (has_unfinished()) {
    for (const TokenEvent& e : step()) {
      auto it = which.find(e.request);
      if (it == which.end()) continue;  // another caller's request
      GenerationOutput& o = outputs[it->second][static_cast<size_t>(e.index)];
      o.tokens.push_back(e.token);
      o.logprobs.push_back(e.logprob);
      o.finish = e.finish;
    }
  }
  return outputs;
}

std::vector<std::vector<float>> Engine::embed(const std::vector<std::vector<int32_t>>& prompts, Pooling pooling) {
  LOOM_REQUIRE(pooling != Pooling::none, "embed: a pooling (mean or last) is required");
  GenerationParams params;
  params.pooling = pooling;
  std::map<RequestId, size_t> which;
  std::vector<std::vector<float>> outputs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) which[add_request(prompts[i], params)] = i;
  while (has_unfinished())
    for (TokenEvent& e : step())
      if (auto it = which.find(e.request); it != which.end()) outputs[it->second] = std::move(e.embedding);
  return outputs;
}

}  // namespace loom::infer
