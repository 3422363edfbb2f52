// loom's side of tests/interop/llama_tokenizer_check.mjs:
//   spm_tokenizer_ids VOCAB_JSON
//     VOCAB_JSON: {"tokens": [...], "scores": [...], "token_types": [...]},
//     the arrays of a Llama GGUF's tokenizer.ggml.tokens/scores/token_type.
//     Each stdin line is a text's bytes in hex (so invalid UTF-8 and NULs
//     pass intact) -> a stdout line
//     {"ids": encode(s), "prompt": BOS + encode(s), "text": decode(ids)}.
//
// The tokenizer is built as `loom generate --model x.gguf` builds it
// (src/cli/model_tokenizer.cpp: spm_vocab, then from_vocab) for a GGUF that
// carries what llama.cpp's converters write for Llama 1/2: BOS 1, EOS 2,
// unknown 0, add_bos_token true, add_eos_token false, add_space_prefix
// true, no remove_extra_whitespaces, no precompiled_charsmap. The prompt is
// the text with its BOS, as llama-tokenizer-js encodes it: control tokens
// written in the text stay text there (Tokenizer::encode_prompt parses them,
// as llama.cpp does: tests/interop/gguf_foreign.sh checks that side).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/sentencepiece.h"

namespace {

loom::text::SentencePieceTokenizer load(const std::string& path) {
  std::ifstream in(path);
  LOOM_REQUIRE(in.good(), "cannot open ", path);
  const nlohmann::json j = nlohmann::json::parse(in);
  loom::text::SpmVocab v;
  v.tokens = j.at("tokens").get<std::vector<std::string>>();
  v.scores = j.at("scores").get<std::vector<float>>();
  v.token_types = j.at("token_types").get<std::vector<int32_t>>();
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = true;
  v.add_eos = false;
  v.add_dummy_prefix = true;
  v.remove_extra_whitespaces = false;
  return loom::text::SentencePieceTokenizer::from_vocab(std::move(v), path);
}

std::string from_hex(const std::string& hex) {
  LOOM_REQUIRE(hex.size() % 2 == 0, "odd-length hex line '", hex, "'");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

int encode(const std::string& vocab_path) {
  const loom::text::SentencePieceTokenizer tok = load(vocab_path);
  const loom::text::Tokenizer& as_generate_sees_it = tok;
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::string text = from_hex(line);
    const std::vector<int32_t> ids = as_generate_sees_it.encode(text);
    const nlohmann::json out = {
        {"ids", ids},
        {"prompt", tok.encode(text, loom::text::SpmEncodeOptions{.add_bos = true})},
        {"text", tok.decode(ids)}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: spm_tokenizer_ids VOCAB_JSON < hex lines\n");
    return 2;
  }
  try {
    return encode(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spm_tokenizer_ids: %s\n", e.what());
    return 1;
  }
}
