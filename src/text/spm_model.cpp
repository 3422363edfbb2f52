#include "text/spm_model.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loom::text {
namespace {

// Protobuf wire types (protobuf.dev/programming-guides/encoding).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kGroupStart = 3, kGroupEnd = 4, kFixed32 = 5 };

const char* wire_type_name(uint32_t w) {
  switch (w) {
    case kVarint: return "varint";
    case kFixed64: return "fixed64";
    case kLen: return "length-delimited";
    case kFixed32: return "fixed32";
    default: return "group";
  }
}

// The bytes of one message, read front to back; every read is checked
// against the bytes left. `base` is the message's offset in the file, so
// errors give file offsets.
class WireReader {
 public:
  WireReader(std::string_view data, size_t base, const std::string& source, std::string message)
      : data_(data), base_(base), source_(source), message_(std::move(message)) {}

  bool done() const { return pos_ == data_.size(); }

  // The next field's key: returns its number and sets *wire.
  uint32_t key(uint32_t* wire) {
    const size_t at = pos_;
    const uint64_t k = varint("a field key");
    *wire = static_cast<uint32_t>(k & 7);
    const uint64_t field = k >> 3;
    if (field == 0 || field > 0x1FFFFFFF) error(at, "field number ", field, " is out of range (1 to 2^29-1)");
    if (*wire == 6 || *wire == 7) error(at, "field ", field, " has wire type ", *wire, ", which does not exist");
    if (*wire == kGroupStart || *wire == kGroupEnd)
      error(at, "field ", field, " is a group (wire type ", *wire, "), which SentencePiece models never contain");
    return static_cast<uint32_t>(field);
  }

  uint64_t varint(const char* what) {
    const size_t at = pos_;
    uint64_t v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= data_.size()) error(at, what, ": varint runs past the end of ", message_);
      const auto b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
      if (!(b & 0x80)) return v;
    }
    error(at, what, ": varint longer than 10 bytes");
  }

  std::string_view bytes(const char* what) {
    const size_t at = pos_;
    const uint64_t n = varint(what);
    if (n > data_.size() - pos_)
      error(at, what, ": length ", n, " exceeds the ", data_.size() - pos_, " bytes left in ", message_);
    const std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  // A length-delimited field read as a nested message.
  WireReader message(const char* what, std::string name) {
    const std::string_view body = bytes(what);
    return WireReader(body, base_ + static_cast<size_t>(body.data() - data_.data()), source_, std::move(name));
  }

  float fixed32_float(const char* what) {
    if (data_.size() - pos_ < 4) error(pos_, what, ": fixed32 runs past the end of ", message_);
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= static_cast<uint32_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }

  void skip(uint32_t wire) {
    switch (wire) {
      case kVarint: varint("an unknown field"); return;
      case kLen: bytes("an unknown field"); return;
      case kFixed64:
      case kFixed32: {
        const size_t n = wire == kFixed64 ? 8 : 4;
        if (data_.size() - pos_ < n) error(pos_, "an unknown field runs past the end of ", message_);
        pos_ += n;
        return;
      }
      default: LOOM_CHECK(false, "wire type ", wire, " passed key()");
    }
  }

  // Checks that a known field has the wire type its proto type implies.
  void expect(uint32_t wire, uint32_t expected, const char* field) const {
    if (wire != expected)
      error(pos_, message_, ".", field, " has wire type ", wire_type_name(wire), ", expected ",
            wire_type_name(expected));
  }

  template <typename... Args>
  [[noreturn]] void error(size_t at, Args&&... args) const {
    fail(source_, ": malformed SentencePiece model at byte ", base_ + at, ": ", std::forward<Args>(args)...);
  }

  const std::string& name() const { return message_; }
  size_t pos() const { return pos_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  size_t base_;
  const std::string& source_;
  std::string message_;
};

int32_t as_int32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

SpmPiece parse_piece(WireReader r) {
  SpmPiece p;
  while (!r.done()) {
    uint32_t wire;
    switch (r.key(&wire)) {
      case 1: r.expect(wire, kLen, "piece"); p.piece = r.bytes("piece"); break;
      case 2: r.expect(wire, kFixed32, "score"); p.score = r.fixed32_float("score"); break;
      case 3: {
        r.expect(wire, kVarint, "type");
        const int32_t t = as_int32(r.varint("type"));
        if (t < 1 || t > 6) r.error(r.pos(), r.name(), ".type is ", t, "; SentencePiece piece types are 1 to 6");
        p.type = static_cast<SpmPieceType>(t);
        break;
      }
      default: r.skip(wire);
    }
  }
  return p;
}

void read_string(WireReader& r, uint32_t wire, const char* field, std::string* out) {
  r.expect(wire, kLen, field);
  *out = r.bytes(field);
}

void read_bool(WireReader& r, uint32_t wire, const char* field, bool* out) {
  r.expect(wire, kVarint, field);
  *out = r.varint(field) != 0;
}

void read_int32(WireReader& r, uint32_t wire, const char* field, int32_t* out) {
  r.expect(wire, kVarint, field);
  *out = as_int32(r.varint(field));
}

void parse_trainer(WireReader r, SpmTrainerSpec* t) {
  while (!r.done()) {
    uint32_t wire;
    switch (r.key(&wire)) {
      case 3: {
        int32_t type;
        read_int32(r, wire, "model_type", &type);
        if (type < 1 || type > 4) r.error(r.pos(), "TrainerSpec.model_type is ", type, "; model types are 1 to 4");
        t->model_type = static_cast<SpmTrainerSpec::ModelType>(type);
        break;
      }
      case 24: read_bool(r, wire, "treat_whitespace_as_suffix", &t->treat_whitespace_as_suffix); break;
      case 35: read_bool(r, wire, "byte_fallback", &t->byte_fallback); break;
      case 40: read_int32(r, wire, "unk_id", &t->unk_id); break;
      case 41: read_int32(r, wire, "bos_id", &t->bos_id); break;
      case 42: read_int32(r, wire, "eos_id", &t->eos_id); break;
      case 43: read_int32(r, wire, "pad_id", &t->pad_id); break;
      case 44: read_string(r, wire, "unk_surface", &t->unk_surface); break;
      case 45: read_string(r, wire, "unk_piece", &t->unk_piece); break;
      case 46: read_string(r, wire, "bos_piece", &t->bos_piece); break;
      case 47: read_string(r, wire, "eos_piece", &t->eos_piece); break;
      case 48: read_string(r, wire, "pad_piece", &t->pad_piece); break;
      default: r.skip(wire);
    }
  }
}

void parse_normalizer(WireReader r, SpmNormalizerSpec* n) {
  while (!r.done()) {
    uint32_t wire;
    switch (r.key(&wire)) {
      case 1: read_string(r, wire, "name", &n->name); break;
      case 2: read_string(r, wire, "precompiled_charsmap", &n->precompiled_charsmap); break;
      case 3: read_bool(r, wire, "add_dummy_prefix", &n->add_dummy_prefix); break;
      case 4: read_bool(r, wire, "remove_extra_whitespaces", &n->remove_extra_whitespaces); break;
      case 5: read_bool(r, wire, "escape_whitespaces", &n->escape_whitespaces); break;
      default: r.skip(wire);
    }
  }
}

}  // namespace

// Proto2 merge semantics: a repeated message appends, a singular scalar
// takes its last value, a singular message seen twice is merged field by
// field (parsing into the same struct does exactly that).
SpmModel spm_model_parse(std::string_view bytes, const std::string& source) {
  SpmModel m;
  WireReader r(bytes, 0, source, "ModelProto");
  while (!r.done()) {
    uint32_t wire;
    switch (r.key(&wire)) {
      case 1: {
        r.expect(wire, kLen, "pieces");
        const std::string name = concat("ModelProto.pieces[", m.pieces.size(), "]");
        m.pieces.push_back(parse_piece(r.message("pieces", name)));
        break;
      }
      case 2:
        r.expect(wire, kLen, "trainer_spec");
        parse_trainer(r.message("trainer_spec", "TrainerSpec"), &m.trainer);
        break;
      case 3:
        r.expect(wire, kLen, "normalizer_spec");
        parse_normalizer(r.message("normalizer_spec", "NormalizerSpec"), &m.normalizer);
        break;
      case 5:
        r.expect(wire, kLen, "denormalizer_spec");
        parse_normalizer(r.message("denormalizer_spec", "denormalizer NormalizerSpec"), &m.denormalizer);
        m.has_denormalizer = true;
        break;
      default: r.skip(wire);
    }
  }
  LOOM_REQUIRE(!m.pieces.empty(), source, ": not a SentencePiece model: it has no pieces (ModelProto field 1)");
  return m;
}

SpmModel spm_model_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in, path, ": cannot open the SentencePiece model");
  std::ostringstream os;
  os << in.rdbuf();
  LOOM_REQUIRE(!in.bad(), path, ": read error");
  return spm_model_parse(os.str(), path);
}

// darts-clone's double-array unit: bits 0-7 label, 8 has_leaf, 9 offset
// scale, 10-31 offset; a value unit holds the value in bits 0-30 and sets
// bit 31, so its label never equals a byte.
namespace {
uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
}  // namespace

SpmCharsMap::SpmCharsMap(std::string_view blob, const std::string& source) : source_(source) {
  if (blob.empty()) return;
  auto bad = [&](auto&&... what) {
    fail(source, ": NormalizerSpec.precompiled_charsmap is malformed: ", what...);
  };
  if (blob.size() <= 4) bad("only ", blob.size(), " bytes");
  uint32_t trie_bytes = 0;
  for (int i = 0; i < 4; ++i) trie_bytes |= static_cast<uint32_t>(static_cast<uint8_t>(blob[i])) << (8 * i);
  if (trie_bytes == 0 || trie_bytes > blob.size() - 4)
    bad("trie size ", trie_bytes, " does not fit the ", blob.size() - 4, " bytes after it");
  if (trie_bytes % 4 != 0) bad("trie size ", trie_bytes, " is not a multiple of 4");
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<uint8_t>(blob[4 + 4 * i + k])) << (8 * k);
    units_[i] = u;
  }
  strings_ = blob.substr(4 + trie_bytes);
}

size_t SpmCharsMap::longest_prefix(std::string_view input, std::string_view* replacement) const {
  if (units_.empty()) return 0;
  constexpr int kMaxResults = 32;  // SentencePiece's Normalizer::kMaxTrieResultsSize
  size_t node = unit_offset(units_[0]);
  size_t best_length = 0;
  uint32_t best_value = 0;
  int results = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    const auto c = static_cast<uint8_t>(input[i]);
    node ^= c;
    if (node >= units_.size() || unit_label(units_[node]) != c) break;  // out of range: no such child
    const uint32_t unit = units_[node];
    node ^= unit_offset(unit);
    if (unit_has_leaf(unit) && node < units_.size()) {
      if (results++ < kMaxResults) best_length = i + 1, best_value = unit_value(units_[node]);
    }
  }
  if (best_length == 0) return 0;
  const size_t end = best_value < strings_.size() ? strings_.find('\0', best_value) : std::string::npos;
  LOOM_REQUIRE(end != std::string::npos, source_, ": NormalizerSpec.precompiled_charsmap is malformed: rule offset ",
               best_value, " is not a NUL-terminated string inside its ", strings_.size(), " bytes of replacements");
  *replacement = std::string_view(strings_).substr(best_value, end - best_value);
  return best_length;
}

}  // namespace loom::text
