#include "text/tokenizer_files.h"

#include <filesystem>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "text/bpe.h"
#include "text/sentencepiece.h"

namespace loom::text {

namespace fs = std::filesystem;

std::string hf_tokenizer_file_in(const std::string& dir) {
  std::error_code ec;
  const fs::path file = fs::path(dir) / kHfTokenizerFile;
  return fs::is_regular_file(file, ec) ? file.string() : std::string();
}

std::string tokenizer_in(const std::string& dir) {
  return tokenizer_files_in(dir).file.empty() ? std::string() : dir;
}

TokenizerFiles tokenizer_files_in(const std::string& dir) {
  std::error_code ec;
  if (const fs::path spm = fs::path(dir) / kSpmTokenizerFile; fs::is_regular_file(spm, ec))
    return {.file = spm.string(), .config = "", .sentencepiece = true};
  const std::string json = hf_tokenizer_file_in(dir);
  if (json.empty()) return {};
  const fs::path config = fs::path(dir) / kHfTokenizerConfigFile;
  return {.file = json, .config = fs::is_regular_file(config, ec) ? config.string() : std::string()};
}

namespace {

// A SentencePiece model (protobuf: ModelProto's first field, the pieces,
// starts with the byte 0x0a) or a file named *.model; anything else is taken
// for a tokenizer.json and its reader says what is wrong with it.
bool is_sentencepiece_file(const fs::path& path) {
  if (path.extension() == ".model") return true;
  std::ifstream in(path, std::ios::binary);
  char first = 0;
  return in.get(first) && first == 0x0a;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  LOOM_REQUIRE(fs::exists(path, ec), "tokenizer '", path,
               "' does not exist: give a Hugging Face tokenizer.json, a SentencePiece tokenizer.model, or a "
               "directory holding one of them or GPT-2's encoder.json and vocab.bpe (run scripts/fetch-data.sh "
               "for GPT-2's)");
  if (!fs::is_directory(path, ec)) {
    const std::string name = fs::path(path).filename().string();
    LOOM_REQUIRE(name != "encoder.json" && name != "vocab.bpe", "tokenizer '", path,
                 "' is one of GPT-2's two files: give the directory holding encoder.json and vocab.bpe, or a "
                 "Hugging Face tokenizer.json");
    if (is_sentencepiece_file(path))
      return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(path));
    return std::make_unique<HfTokenizer>(load_hf_tokenizer(path));
  }
  // A SentencePiece model's directory (Llama 2, Mistral, TinyLlama) holds its
  // tokenizer.model, and often a tokenizer.json of the same vocabulary in
  // the form of `tokenizers`' SentencePiece emulation: the tokenizer.model
  // decides, as SentencePiece itself is the reference (the tokenizer.json
  // alone is read too: hf_tokenizer.h).
  if (const TokenizerFiles own = tokenizer_files_in(path); !own.file.empty()) return load_tokenizer_files(own);
  LOOM_REQUIRE(fs::exists(fs::path(path) / "encoder.json", ec), "tokenizer directory '", path,
               "' holds no tokenizer.json, tokenizer.model, or GPT-2's encoder.json and vocab.bpe (run "
               "scripts/fetch-data.sh for GPT-2's)");
  return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(path));
}

std::unique_ptr<Tokenizer> load_tokenizer_files(const TokenizerFiles& files) {
  std::error_code ec;
  LOOM_REQUIRE(fs::is_regular_file(files.file, ec), "tokenizer file '", files.file, "' does not exist");
  if (files.sentencepiece)
    return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(files.file));
  return std::make_unique<HfTokenizer>(load_hf_tokenizer(files.file, files.config));
}

bool save_hf_tokenizer_files(const std::string& dir, const Tokenizer& tok, const TokenizerConfigExtras& extras) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tok);
  std::unique_ptr<HfTokenizer> converted;
  if (const auto* gpt2 = dynamic_cast<const Gpt2Tokenizer*>(&tok)) {
    converted = std::make_unique<HfTokenizer>(HfTokenizer::from_spec(hf_spec_of_gpt2(*gpt2), "GPT-2's vocabulary"));
    hf = converted.get();
  }
  if (hf == nullptr) return false;
  const std::string json = tokenizer_json_text(*hf);
  const std::string config = tokenizer_config_json_text(*hf, extras);
  write_file_atomic((fs::path(dir) / kHfTokenizerFile).string(), json);
  write_file_atomic((fs::path(dir) / kHfTokenizerConfigFile).string(), config);
  return true;
}

}  // namespace loom::text
