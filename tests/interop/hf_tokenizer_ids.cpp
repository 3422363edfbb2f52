// loom's side of tests/interop/hf_tokenizer_check.mjs:
//   hf_tokenizer_ids write-gpt2 ENCODER_DIR OUT_DIR
//     GPT-2's tokenizer (encoder.json + vocab.bpe) as OUT_DIR/tokenizer.json
//     and tokenizer_config.json, as `loom convert --to hf` writes them.
//   hf_tokenizer_ids write-llama3 ENCODER_DIR OUT_DIR
//     a Llama-3-style tokenizer on GPT-2's vocabulary: Llama 3's split
//     pattern, ignore_merges, special tokens after the vocabulary
//     (<|begin_of_text|> the BOS it adds, <|end_of_text|> the EOS, ...).
//   hf_tokenizer_ids encode TOKENIZER
//     each stdin line a JSON string -> a stdout line
//     {"ids": encode(s), "prompt": encode_prompt(s), "text": decode(ids)}.
// OUT_DIR is created if missing.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer_files.h"

namespace {

using loom::text::HfAddedToken;

int write_llama3(const std::string& encoder_dir, const std::string& out) {
  const auto gpt2 = loom::text::Gpt2Tokenizer::load(encoder_dir);
  loom::text::HfBpeSpec spec = loom::text::hf_spec_of_gpt2(gpt2);
  spec.split = loom::text::SplitPattern::llama3;
  spec.ignore_merges = true;
  int32_t id = gpt2.vocab_size();
  for (const char* name : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                           "<|end_header_id|>"})
    spec.added_tokens.push_back(
        HfAddedToken{.id = id++, .content = name, .special = true, .normalized = false});
  spec.bos_id = gpt2.vocab_size();
  spec.add_bos = true;
  spec.eos_id = spec.bos_id + 1;
  const auto tok = loom::text::HfTokenizer::from_spec(std::move(spec), "Llama-3-style GPT-2");
  return loom::text::save_hf_tokenizer_files(out, tok, {}) ? 0 : 1;
}

int encode(const std::string& path) {
  const auto tok = loom::text::load_tokenizer(path);
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::string text = nlohmann::json::parse(line).get<std::string>();
    const std::vector<int32_t> ids = tok->encode_special(text);
    const nlohmann::json out = {{"ids", ids}, {"prompt", tok->encode_prompt(text)}, {"text", tok->decode(ids)}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd.starts_with("write-") && argc == 4) std::filesystem::create_directories(argv[3]);
    if (cmd == "write-gpt2" && argc == 4) {
      const auto gpt2 = loom::text::Gpt2Tokenizer::load(argv[2]);
      return loom::text::save_hf_tokenizer_files(argv[3], gpt2, {}) ? 0 : 1;
    }
    if (cmd == "write-llama3" && argc == 4) return write_llama3(argv[2], argv[3]);
    if (cmd == "encode" && argc == 3) return encode(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_tokenizer_ids: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: hf_tokenizer_ids write-gpt2 ENCODER_DIR OUT_DIR | write-llama3 ENCODER_DIR OUT_DIR | "
               "encode TOKENIZER\n");
  return 2;
}
