// What the CLI and the serving path need of a tokenizer, whichever kind a
// model carries: GPT-2's byte-level BPE (bpe.h), a Hugging Face
// tokenizer.json's byte-level BPE (hf_tokenizer.h: GPT-2's, Llama 3's) or
// Llama's SentencePiece BPE (sentencepiece.h). One interface, chosen from the
// model's files (cli/model_tokenizer.h, text/tokenizer_files.h), as
// llama.cpp's llama_vocab is.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::text {

// Control tokens a stream writes as their text, where a format needs to see
// them (gpt-oss's harmony markers, serve/harmony.h): id and text.
using ShownTokens = std::vector<std::pair<int32_t, std::string>>;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "gpt2" or "llama" (GGUF's tokenizer.ggml.model names).
  virtual std::string_view kind() const = 0;
  // text -> ids, no BOS or EOS added; control tokens written out in the
  // text stay text (llm.c's encode_ordinary, transformers'
  // split_special_tokens): what training data needs.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // text -> ids where control tokens written out in the text ("<s>",
  // "[INST]", "<|endoftext|>") are their ids: llama.cpp's parse_special,
  // transformers' split on added tokens; what a prompt or a rendered chat
  // template needs. Kinds whose encode() already does so keep it.
  virtual std::vector<int32_t> encode_special(std::string_view text) const { return encode(text); }
  // A prompt's ids: encode_special, with bos_id() first when add_bos()
  // (Llama's tokenizers; GPT-2's adds nothing).
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  // A rendered chat template's ids: encode_prompt's, but a BOS the template
  // wrote itself ({{ bos_token }}) is not doubled, as vLLM (which tokenizes
  // a template's text without special tokens) and llama.cpp give it.
  std::vector<int32_t> encode_chat(std::string_view text) const;
  // ids -> text. loom::Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // What one generated token adds to the text streamed so far: its bytes
  // (possibly part of a UTF-8 character: a stream holds them until the
  // character completes). A control token adds nothing. The concatenation
  // over a continuation equals decode() of it, but for where decode drops
  // the ▁ of the first piece of a whole text.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The end-of-text token generation stops at; -1 if none.
  virtual int32_t eos_id() const = 0;
  virtual int32_t bos_id() const { return -1; }
  virtual bool add_bos() const { return false; }
};

}  // namespace loom::text
