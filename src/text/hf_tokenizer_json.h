// Hugging Face's tokenizer files for a byte-level BPE tokenizer
// (hf_tokenizer.h): tokenizer.json, read and written, and from
// tokenizer_config.json the names of the BOS and EOS tokens (and, written,
// the chat template). What loom reads of tokenizer.json:
//   model          BPE: vocab, merges ("a b" or ["a", "b"]), ignore_merges;
//                  byte_fallback, dropout, continuing_subword_prefix and
//                  end_of_word_suffix only unset
//   normalizer     none
//   pre_tokenizer  ByteLevel (its regex: GPT-2's pattern; add_prefix_space),
//                  or a Sequence of a Split (GPT-2's or Llama 3's regex,
//                  Isolated, not inverted) and ByteLevel without its regex
//   post_processor none, ByteLevel, TemplateProcessing with at most one
//                  special token, before the text (the BOS), or a Sequence of these
//   decoder        ByteLevel
//   added_tokens   all of them, with their flags
// Anything else is a loom::Error naming the file and the field. truncation
// and padding are ignored (loom neither truncates nor pads an encoding).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "text/hf_tokenizer.h"

namespace loom::text {

inline constexpr const char* kHfTokenizerFile = "tokenizer.json";
inline constexpr const char* kHfTokenizerConfigFile = "tokenizer_config.json";

// The spec of a tokenizer.json's text; `path` names the file in messages.
HfBpeSpec parse_tokenizer_json(std::string_view json_text, const std::string& path);

// tokenizer_config.json's eos_token and bos_token (a string, or an object
// with "content"), where present, name spec's EOS and BOS (the BOS only
// where the post-processor named none). loom::Error for a name that is no
// token of spec.
void apply_tokenizer_config(HfBpeSpec& spec, std::string_view json_text, const std::string& path);

// path: a tokenizer.json. tokenizer_config.json beside it is read when
// present. Without an EOS from it, the first special added token among
// <|endoftext|>, <|end_of_text|>, <|im_end|>, </s> is the EOS.
HfTokenizer load_hf_tokenizer(const std::string& path);
// The same with the tokenizer_config.json at config_path ("": none), for a
// tokenizer.json kept apart from its directory (a store model's layers).
HfTokenizer load_hf_tokenizer(const std::string& path, const std::string& config_path);

// tokenizer.json for tok, as the `tokenizers` library writes one (merges as
// "a b" unless a token holds a space). Reading it gives tok's spec back.
std::string tokenizer_json_text(const HfTokenizer& tok);

struct TokenizerConfigExtras {
  std::string chat_template;     // empty: none
  int64_t model_max_length = 0;  // 0: not written
};
// tokenizer_config.json for tok: its BOS and EOS names, add_bos_token, the
// added tokens, tokenizer_class PreTrainedTokenizerFast (the tokenizer is
// tokenizer.json), clean_up_tokenization_spaces false (decode gives the
// bytes back), and the extras.
std::string tokenizer_config_json_text(const HfTokenizer& tok, const TokenizerConfigExtras& extras);

}  // namespace loom::text
