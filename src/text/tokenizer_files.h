// Which tokenizer a path names, and a tokenizer written beside a model as
// Hugging Face's files. One place decides, for --tokenizer, `data prepare`
// and a model directory's own tokenizer (cli/model_tokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "text/hf_tokenizer_json.h"
#include "text/tokenizer.h"

namespace loom::text {

// A SentencePiece model's file in a Hugging Face model directory.
inline constexpr const char* kSpmTokenizerFile = "tokenizer.model";

// path: a Hugging Face tokenizer.json (any file name), a SentencePiece
// tokenizer.model (a *.model file, or any file that starts as one), or a
// directory holding one of them or GPT-2's encoder.json and vocab.bpe; a
// directory's tokenizer.model comes first (a SentencePiece model's
// directory often holds a tokenizer.json of it too: SentencePiece itself is
// the reference), then its tokenizer.json, then GPT-2's files. loom::Error naming the path and what
// is expected otherwise, or for a file that cannot be read.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// dir/tokenizer.json when that is a file, else "".
std::string hf_tokenizer_file_in(const std::string& dir);
// dir when it holds a tokenizer.model or a tokenizer.json (what
// load_tokenizer(dir) reads first), else "".
std::string tokenizer_in(const std::string& dir);

// The files a directory's own tokenizer is read from, in load_tokenizer's
// order: its tokenizer.model, else its tokenizer.json with the
// tokenizer_config.json beside it (config: "" when there is none); both ""
// when the directory has neither (GPT-2's encoder.json is not a model's own).
struct TokenizerFiles {
  std::string file, config;
  bool sentencepiece = false;  // file is a SentencePiece model, else a tokenizer.json
};
TokenizerFiles tokenizer_files_in(const std::string& dir);

// A tokenizer from files kept apart from their directory (a store model's
// layers, whose names say nothing): file a SentencePiece model or a
// tokenizer.json as `sentencepiece` says; config the tokenizer_config.json
// that goes with a tokenizer.json ("": none). loom::Error naming the file
// for one that cannot be read as that kind.
std::unique_ptr<Tokenizer> load_tokenizer_files(const TokenizerFiles& files);

// Writes dir/tokenizer.json and dir/tokenizer_config.json (each atomically)
// for tok: GPT-2's BPE or a tokenizer.json's. False, writing nothing, for a
// kind that has no tokenizer.json form here (SentencePiece).
bool save_hf_tokenizer_files(const std::string& dir, const Tokenizer& tok, const TokenizerConfigExtras& extras);

}  // namespace loom::text
