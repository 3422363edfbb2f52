// SentencePiece's tokenizer.model: a serialized sentencepiece.ModelProto
// (sentencepiece_model.proto, proto2), read by our own protobuf wire-format
// decoder. Only the fields a tokenizer needs are kept; every other field is
// skipped by its wire type. Every length is checked against the bytes left,
// so a truncated or corrupt file is one loom::Error naming the file, the
// field and the byte offset, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

// ModelProto.SentencePiece.Type; the numbers are the proto's, and also
// llama.cpp's GGUF tokenizer.ggml.token_type values.
enum class SpmPieceType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct SpmPiece {
  std::string piece;  // field 1
  float score = 0;    // field 2
  SpmPieceType type = SpmPieceType::kNormal;  // field 3
};

// TrainerSpec (ModelProto field 2): the fields that change encoding or
// decoding. Defaults are the proto's.
struct SpmTrainerSpec {
  enum class ModelType : int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  ModelType model_type = ModelType::kUnigram;  // 3
  bool treat_whitespace_as_suffix = false;     // 24
  bool byte_fallback = false;                  // 35
  int32_t unk_id = 0;                          // 40
  int32_t bos_id = 1;                          // 41
  int32_t eos_id = 2;                          // 42
  int32_t pad_id = -1;                         // 43
  std::string unk_surface = " \xE2\x81\x87 ";  // 44: U+2047 between spaces
  std::string unk_piece = "<unk>";             // 45
  std::string bos_piece = "<s>";               // 46
  std::string eos_piece = "</s>";              // 47
  std::string pad_piece = "<pad>";             // 48
};

// NormalizerSpec (ModelProto fields 3, and 5 for the denormalizer).
struct SpmNormalizerSpec {
  std::string name;                       // 1: "identity" for Llama
  std::string precompiled_charsmap;       // 2: see SpmCharsMap
  bool add_dummy_prefix = true;           // 3
  bool remove_extra_whitespaces = true;   // 4
  bool escape_whitespaces = true;         // 5
};

struct SpmModel {
  std::vector<SpmPiece> pieces;  // ModelProto field 1; id = index
  SpmTrainerSpec trainer;
  SpmNormalizerSpec normalizer;
  bool has_denormalizer = false;  // field 5 present
  SpmNormalizerSpec denormalizer;
};

// Parses a serialized ModelProto; `source` names it in errors (a path).
SpmModel spm_model_parse(std::string_view bytes, const std::string& source);
// Reads and parses a tokenizer.model file.
SpmModel spm_model_read(const std::string& path);

// NormalizerSpec.precompiled_charsmap: <u32 trie size><darts-clone double
// array of u32 units><NUL-terminated replacement strings>. The trie maps a
// byte prefix of the input to the offset of its replacement. Validated on
// construction; lookups check every index, so a corrupt array is an error,
// never a wild read.
class SpmCharsMap {
 public:
  SpmCharsMap() = default;
  // blob empty: no rules (every lookup misses).
  SpmCharsMap(std::string_view blob, const std::string& source);

  bool empty() const { return units_.empty(); }
  // The longest rule matching a prefix of `input` (among the first 32
  // prefixes the trie reports, as SentencePiece does): sets *replacement
  // and returns the matched length, or returns 0 when none matches.
  size_t longest_prefix(std::string_view input, std::string_view* replacement) const;

 private:
  std::vector<uint32_t> units_;
  std::string strings_;
  std::string source_;
};

}  // namespace loom::text
