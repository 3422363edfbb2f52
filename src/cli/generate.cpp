// loom generate: text from a model directory (loom or Hugging Face format)
// through the serving engine (infer::Engine: paged KV cache, continuous
// batching), for one prompt or many, n samples each. One prompt and one
// sample stream to stdout as they are generated; otherwise each output is
// printed when all are done, in prompt order, or as JSON Lines (--json).
// The KV cache report goes to stderr, so stdout holds only the text.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/model_tokenizer.h"
#include "cli/commands.h"
#include "cli/engine_setup.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "infer/text_stream.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/paged_runner.h"
#include "text/tokenizer.h"

namespace loom::cli {
namespace {

// --logprobs not given (a value no one can type: any negative one given is refused).
constexpr int64_t kNoLogprobs = INT64_MIN;

struct GenerateArgs {
  std::string model_dir, tokenizer;  // tokenizer: model_tokenizer()'s --tokenizer
  std::vector<std::string> prompts, stops;
  infer::GenerationParams gen{.stop = {.max_tokens = 64}};
  int64_t logprobs = kNoLogprobs;  // kNoLogprobs: none; 0: the chosen token's; N: and the N most likely
  bool json = false;
  infer::EngineArgs engine;
};

// One generated sequence: prompt `prompt`, sample `index` of it.
struct Output {
  size_t prompt = 0;
  int64_t index = 0;
  std::unique_ptr<infer::TextStream> text;
  std::vector<infer::TokenEvent> tokens;
  infer::FinishReason finish = infer::FinishReason::none;
  std::string matched;  // the stop string that ended it
};

std::vector<std::vector<int32_t>> encode_prompts(const GenerateArgs& args, const text::Tokenizer& tok,
                                                 int64_t max_seq_len) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < args.prompts.size(); ++i) {
    // An empty prompt starts from <|endoftext|>, as GPT-2's unconditional samples do.
    std::vector<int32_t> p = tok.encode_prompt(args.prompts[i]);
    if (p.empty()) p.push_back(tok.eos_id());
    const std::string which = args.prompts.size() == 1 ? "--prompt" : "--prompt " + std::to_string(i + 1);
    LOOM_REQUIRE(static_cast<int64_t>(p.size()) < max_seq_len, which, " is ", p.size(),
                 " tokens but the model's max_seq_len is ", max_seq_len, ": shorten the prompt to at most ",
                 max_seq_len - 1, " tokens (a new token needs a position too)");
    out.push_back(std::move(p));
  }
  return out;
}

// The engine for these requests: sequences as long as the longest prompt
// plus max_tokens unless --max-model-len says otherwise (a long-context model
// gets a cache for the request, not for its whole context), and as many of
// them at once as there are (at most --max-num-seqs; the KV cache's default
// holds them all, within half the available memory: then they take turns).
infer::EngineConfig engine_config(const GenerateArgs& args, const model::ModelConfig& cfg,
                                  const std::vector<std::vector<int32_t>>& prompts) {
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  infer::EngineArgs e = args.engine;
  if (e.max_model_len == 0) e.max_model_len = longest + std::min(args.gen.stop.max_tokens, cfg.max_seq_len);
  const int64_t sequences = static_cast<int64_t>(prompts.size()) * args.gen.n;
  e.max_num_seqs = std::clamp<int64_t>(sequences, 1, e.max_num_seqs);
  return e.config(cfg);
}

void print_kv_report(const infer::Engine& engine, const model::ModelConfig& cfg, const GenerateArgs& args,
                     const std::string& weights) {
  const infer::EngineConfig& c = engine.config();
  const int64_t usable = c.num_blocks - 1;  // block 0 is reserved
  std::fprintf(stderr,
               "generate: KV cache of %lld blocks x %lld tokens = %lld tokens (%.1f MiB %s), sequences up to %lld "
               "tokens; weights %s (%lld layers)\n",
               static_cast<long long>(usable), static_cast<long long>(c.block_size),
               static_cast<long long>(usable * c.block_size), engine.runner().kv_cache_bytes() / double(1 << 20),
               args.engine.kv_dtype.c_str(), static_cast<long long>(c.max_model_len), weights.c_str(),
               static_cast<long long>(cfg.n_layer));
}

std::string json_text(const std::string& bytes) {
  // A token's bytes may be part of a character: replaced, never an exception.
  return nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json token_json(const text::Tokenizer& tok, int32_t id, float logprob) {
  const std::string piece = id < tok.vocab_size() ? tok.token_bytes(id) : std::string();
  return {{"token", id}, {"text", nlohmann::json::parse(json_text(piece))}, {"logprob", logprob}};
}

void print_json(const Output& o, const GenerateArgs& args, const std::vector<int32_t>& prompt,
                const text::Tokenizer& tok) {
  nlohmann::json j = {{"prompt_index", o.prompt},
                      {"index", o.index},
                      {"prompt", nlohmann::json::parse(json_text(args.prompts[o.prompt]))},
                      {"text", nlohmann::json::parse(json_text(o.text->text()))},
                      {"finish_reason", infer::finish_reason_name(o.finish)},
                      {"stop", o.matched.empty() ? nlohmann::json() : nlohmann::json(o.matched)},
                      {"prompt_tokens", prompt.size()},
                      {"completion_tokens", o.tokens.size()}};
  nlohmann::json ids = nlohmann::json::array(), lps = nlohmann::json::array();
  for (const infer::TokenEvent& e : o.tokens) {
    ids.push_back(e.token);
    if (args.logprobs < 0) continue;
    nlohmann::json t = token_json(tok, e.token, e.logprob), top = nlohmann::json::array();
    for (const infer::TokenLogprob& a : e.top) top.push_back(token_json(tok, a.token, a.logprob));
    t["top_logprobs"] = std::move(top);
    lps.push_back(std::move(t));
  }
  j["tokens"] = std::move(ids);
  if (args.logprobs >= 0) j["logprobs"] = std::move(lps);
  std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// Text mode: the prompt and its continuation; a header when there are several;
// with --logprobs a line per token after it.
void print_text(const Output& o, const GenerateArgs& args, bool header, const text::Tokenizer& tok) {
  if (header)
    std::printf("--- prompt %zu, sample %lld (finish_reason: %s) ---\n", o.prompt + 1,
                static_cast<long long>(o.index + 1), infer::finish_reason_name(o.finish));
  std::printf("%s%s\n", args.prompts[o.prompt].c_str(), o.text->text().c_str());
  if (args.logprobs < 0) return;
  for (const infer::TokenEvent& e : o.tokens) {
    std::printf("  %10.4f  %s", e.logprob, json_text(token_json(tok, e.token, 0)["text"]).c_str());
    for (size_t k = 0; k < e.top.size(); ++k)
      std::printf("%s%s %.4f", k == 0 ? "   top: " : ", ",
                  json_text(token_json(tok, e.top[k].token, 0)["text"]).c_str(), e.top[k].logprob);
    std::printf("\n");
  }
}

// A sequence's new token: its text (streamed when `stream`), a stop string
// that ends it, or the engine's own end.
void on_token(infer::Engine& engine, Output& o, const infer::TokenEvent& e, infer::RequestId id, bool stream) {
  o.tokens.push_back(e);
  // An EOS or stop token that ended the sample adds no text (as the servers, vLLM's detokenizer).
  infer::TextStream::Piece piece = o.text->feed(e.token, e.finish == infer::FinishReason::stop);
  std::string text = std::move(piece.text);
  if (piece.stopped) {
    o.finish = infer::FinishReason::stop;
    o.matched = piece.matched;
    if (e.finish == infer::FinishReason::none) engine.finish_sequence(id, e.index, infer::FinishReason::stop);
  } else if (e.finish != infer::FinishReason::none) {
    o.finish = e.finish;
    text += o.text->flush();
  }
  if (stream && !text.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
}

// The flags' checks, made before the first byte of output, so a rejected run prints nothing.
void check_args(const GenerateArgs& args) {
  const infer::StopParams& stop = args.gen.stop;
  LOOM_REQUIRE(stop.max_tokens >= 1, "--max-tokens = ", stop.max_tokens, " is invalid: allowed values are >= 1");
  LOOM_REQUIRE(stop.min_tokens >= 0 && stop.min_tokens <= stop.max_tokens, "--min-tokens = ", stop.min_tokens,
               " is invalid: allowed 0 to --max-tokens (", stop.max_tokens, ")");
  LOOM_REQUIRE(args.gen.n >= 1, "-n = ", args.gen.n, " is invalid: allowed values are >= 1");
  args.engine.validate();
  args.gen.validate();
  LOOM_REQUIRE(args.logprobs == kNoLogprobs || (args.logprobs >= 0 && args.logprobs <= 20), "--logprobs = ",
               args.logprobs, " is invalid: allowed 0 to 20");
  (void)infer::StopStrings(args.stops);  // empty stop strings are an error
}

void run_generate(const GenerateArgs& args) {
  check_args(args);
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  std::string tokenizer_from;
  const std::unique_ptr<text::Tokenizer> tokenizer = model_tokenizer(dir, args.tokenizer, &tokenizer_from);
  const text::Tokenizer& tok = *tokenizer;
  LOOM_REQUIRE(dir.config.vocab_size >= tok.vocab_size(), args.model_dir, ": model vocab_size ",
               dir.config.vocab_size, " is smaller than the tokenizer's ", tok.vocab_size(), " tokens (",
               tokenizer_from, ")");
  const std::vector<std::vector<int32_t>> prompts = encode_prompts(args, tok, dir.config.max_seq_len);
  Pools pools;
  const model::ServingWeights weights = load_weights(dir, args.engine, pools);
  infer::Engine engine(dir.config, weights.params, pools, engine_config(args, dir.config, prompts),
                       weights.quant_or_null());
  print_kv_report(engine, dir.config, args, weights_description(weights, args.engine.dtype));

  infer::GenerationParams gen = args.gen;
  // The tokenizer's end-of-text and the model's generation_config.json ids, as transformers' generate and vLLM stop.
  gen.stop.eos_token_ids = {tok.eos_id()};
  for (int32_t id : dir.eos_token_ids)
    if (std::find(gen.stop.eos_token_ids.begin(), gen.stop.eos_token_ids.end(), id) == gen.stop.eos_token_ids.end())
      gen.stop.eos_token_ids.push_back(id);
  gen.top_logprobs = std::max<int64_t>(args.logprobs, 0);
  const bool stream = prompts.size() == 1 && gen.n == 1 && !args.json;
  std::map<infer::RequestId, size_t> which;
  std::vector<Output> outputs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    which[engine.add_request(prompts[i], gen)] = i;
    for (int64_t k = 0; k < gen.n; ++k) {
      auto text = std::make_unique<infer::TextStream>(tok, args.stops, gen.stop.eos_token_ids, text::ShownTokens{},
                                                      gen.stop.min_tokens);
      outputs.push_back({i, k, std::move(text), {}, infer::FinishReason::none, {}});
    }
  }
  if (stream) {
    std::fwrite(args.prompts[0].data(), 1, args.prompts[0].size(), stdout);
    std::fflush(stdout);
  }
  while (engine.has_unfinished())
    for (const infer::TokenEvent& e : engine.step())
      on_token(engine, outputs[which.at(e.request) * static_cast<size_t>(gen.n) + static_cast<size_t>(e.index)], e,
               e.request, stream);
  if (stream) std::fputc('\n', stdout);
  for (const Output& o : outputs) {
    if (args.json) print_json(o, args, prompts[o.prompt], tok);
    else if (!stream) print_text(o, args, outputs.size() > 1, tok);
    else if (args.logprobs >= 0) print_text(o, args, false, tok);
    const auto made = static_cast<int64_t>(o.tokens.size());
    if (o.finish == infer::FinishReason::length && made < gen.stop.max_tokens)
      log_warn("generate: prompt ", o.prompt + 1, " stopped after ", made, " of --max-tokens ", gen.stop.max_tokens,
               " new tokens: the sequence reached ",
               args.engine.max_model_len > 0 && args.engine.max_model_len < dir.config.max_seq_len
                   ? concat("--max-model-len ", args.engine.max_model_len)
                   : concat("the model's max_seq_len = ", dir.config.max_seq_len));
  }
  std::fflush(stdout);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text from a model directory (loom's loom_config.json or Hugging Face's config.json, "
                  "with model.safetensors) through the serving engine");
  auto args = std::make_shared<GenerateArgs>();
  infer::SamplerConfig& s = args->gen.sampler;
  infer::StopParams& stop = args->gen.stop;
  cmd->add_option("--model", args->model_dir, "model directory, or a .gguf file")->required();
  cmd->add_option("--prompt", args->prompts, "text to continue (empty: start from <|endoftext|>); repeat the "
                                             "option for several prompts, generated together")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("-n", args->gen.n, "samples per prompt (the prompt is computed once)")->capture_default_str();
  cmd->add_option("--max-tokens", stop.max_tokens, "new tokens at most (stops earlier at <|endoftext|>, a stop "
                                                   "string or when the sequence reaches model.max_seq_len)")
      ->capture_default_str();
  cmd->add_option("--min-tokens", stop.min_tokens, "new tokens before <|endoftext|> may end a sample")
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", stop.ignore_eos, "go on past <|endoftext|> (benchmarks)");
  cmd->add_option("--stop", args->stops, "stop string: the text ends before it (repeat for several)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--temperature", s.temperature, "0: greedy; higher: more random")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "sample among the most likely tokens of total mass p, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "drop tokens less likely than min-p times the most likely one, in [0, 1]")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "in [-2, 2]: lower the logit of every token already "
                                                            "generated")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "in [-2, 2]: lower it by the times it was generated")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "> 0, 1 is none: divide the logits of tokens of "
                                                                "the prompt and output (CTRL)")
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "random seed: the same seed gives the same text")->capture_default_str();
  cmd->add_option("--logprobs", args->logprobs, "report each token's log-probability and the N most likely, 0 to "
                                                "20");
  cmd->add_flag("--json", args->json, "print JSON Lines: one object per sample with text, tokens, finish_reason, "
                                      "counts (and logprobs)");
  add_engine_options(*cmd, args->engine);
  cmd->add_option("--tokenizer", args->tokenizer, kTokenizerHelp)
      ->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace loom::cli
