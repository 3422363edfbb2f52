// A request as the scheduler keeps it, and the rules that end it. Pure data:
// the engine owns the sampling parameters and the text; the scheduler owns
// the token ids, how many of them have K/V computed, and the token-level
// stop rules (stop strings are matched on text: infer/stop_strings.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "infer/kv_cache_manager.h"

namespace loom::infer {

// Why a request ended; none while it runs. OpenAI's finish_reason names:
// stop (an EOS, a stop token or a stop string), length (max_tokens or the
// context), abort (the client went away or the engine was told to stop it).
enum class FinishReason : uint8_t { none, stop, length, abort };
const char* finish_reason_name(FinishReason reason);

struct StopParams {
  int64_t max_tokens = 16;  // new tokens at most; >= 1
  int64_t min_tokens = 0;   // EOS and stop tokens do not end a request before this many; <= max_tokens
  std::vector<int32_t> eos_token_ids{};  // the model's end of sequence (emitted as a token, not as text)
  bool ignore_eos = false;              // keep going past EOS (benchmarks)
  std::vector<int32_t> stop_token_ids{};  // end with reason stop; the token is part of the output
  // loom::Error naming the field and what is allowed.
  void validate() const;
};

enum class RequestStatus : uint8_t { waiting, running, finished };

struct Request {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // the prompt, then every sampled token
  int64_t num_prompt_tokens = 0;
  // Tokens whose K/V are computed or scheduled in the step under way; counted
  // again from 0 after a preemption (recompute).
  int64_t num_computed_tokens = 0;
  StopParams stop;
  std::vector<uint64_t> extra_keys;  // part of every block hash (KvCacheManager)
  bool reuse_prefix = true;          // false: its cached prefix is computed again
  RequestStatus status = RequestStatus::waiting;
  FinishReason finish = FinishReason::none;
  int64_t num_preemptions = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  // Every known token has its K/V: the last one's logits give the next token.
  bool awaits_token() const { return num_computed_tokens == num_tokens(); }
};

// The token-level rules, checked after a sampled token was appended: a stop
// or EOS token (unless fewer than min_tokens are out, or ignore_eos for EOS)
// ends with stop; max_tokens new tokens, or max_model_len tokens in all, end
// with length. When the last allowed token is also a stop token, the reason
// is stop: the model did stop there.
FinishReason check_stop(const Request& r, int64_t max_model_len);

// A prompt the engine can run, the one check every layer uses (the engine,
// its scheduler, the server's loop before queueing): at least one token,
// every id below vocab_size (0: not checked), and shorter than max_model_len
// (a new token needs a position). loom::Error saying which rule and the numbers.
void check_prompt(std::span<const int32_t> prompt, int64_t vocab_size, int64_t max_model_len);

}  // namespace loom::infer
