// Reading tokenizer.json and tokenizer_config.json (hf_tokenizer_json.h).
#include "text/hf_tokenizer_json.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::text {
namespace {

using nlohmann::json;

// A field's value as messages show it: at most 80 characters.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// obj[key], or nullptr when absent or null.
const json* find(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

struct Reader {
  const std::string& path;

  [[noreturn]] void fail_at(const std::string& field, const std::string& what) const {
    fail(path, ": ", field, ": ", what);
  }
  bool flag(const json& obj, const char* key, bool fallback, const std::string& field) const {
    const json* v = find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail_at(field + "." + key, "expected true or false, got " + shown(*v));
    return v->get<bool>();
  }
  std::string text(const json& obj, const char* key, const std::string& field) const {
    const json* v = find(obj, key);
    if (v == nullptr || !v->is_string())
      fail_at(field + "." + key, "expected a string, got " + (v ? shown(*v) : "none"));
    return v->get<std::string>();
  }
  int32_t id(const json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= std::numeric_limits<int32_t>::max())
      fail_at(field, "expected an id, an integer in [0, 2^31 - 1), got " + shown(v));
    return v.get<int32_t>();
  }
  // A component's "type" ("model", "pre_tokenizer", ...).
  std::string type(const json& obj, const std::string& field) const {
    if (!obj.is_object()) fail_at(field, "expected an object, got " + shown(obj));
    return text(obj, "type", field);
  }
  [[noreturn]] void unsupported(const std::string& field, const std::string& what) const {
    fail_at(field, what +
                       " is not supported: loom reads BPE tokenizers, byte-level (as GPT-2's and Llama 3's) or in "
                       "SentencePiece's form (as Llama 2's and Mistral's)");
  }
};

// The steps of a Sequence component (its `list_key` array), or the component alone.
std::vector<std::pair<const json*, std::string>> steps_of(const Reader& r, const json& c, const std::string& field,
                                                          const char* list_key) {
  std::vector<std::pair<const json*, std::string>> steps;
  if (r.type(c, field) != "Sequence") return {{&c, field}};
  const json* list = find(c, list_key);
  if (list == nullptr || !list->is_array()) r.fail_at(field + "." + list_key, "expected an array");
  for (size_t i = 0; i < list->size(); ++i)
    steps.emplace_back(&(*list)[i], field + "." + list_key + "[" + std::to_string(i) + "]");
  return steps;
}

std::pair<std::string, std::string> parse_merge(const Reader& r, const json& m, size_t i) {
  const std::string field = "model.merges[" + std::to_string(i) + "]";
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    if (space != std::string::npos && space > 0 && space + 1 < s.size() && s.find(' ', space + 1) == std::string::npos)
      return {s.substr(0, space), s.substr(space + 1)};
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string() &&
             !m[0].get_ref<const std::string&>().empty() && !m[1].get_ref<const std::string&>().empty()) {
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  }
  r.fail_at(field, "expected \"left right\" (one space) or [\"left\", \"right\"], got " + shown(m));
}

void parse_model(const Reader& r, const json& doc, HfBpeSpec& spec) {
  const json* model = find(doc, "model");
  if (model == nullptr) r.fail_at("model", "missing: a tokenizer.json has a model");
  if (!model->is_object()) r.fail_at("model", "expected an object, got " + shown(*model));
  const json* type = find(*model, "type");
  const std::string kind = type && type->is_string() ? type->get<std::string>() : find(*model, "merges") ? "BPE" : "?";
  if (kind != "BPE") r.unsupported("model.type", "'" + kind + "' (WordPiece, Unigram and WordLevel models)");
  if (spec.spm) {
    spec.spm->byte_fallback = r.flag(*model, "byte_fallback", false, "model");
    spec.spm->fuse_unk = r.flag(*model, "fuse_unk", false, "model");
    if (const json* unk = find(*model, "unk_token")) {
      if (!unk->is_string()) r.fail_at("model.unk_token", "expected a token's text or null, got " + shown(*unk));
      spec.spm->unk_token = unk->get<std::string>();
    }
  } else if (r.flag(*model, "byte_fallback", false, "model")) {
    r.unsupported("model.byte_fallback", "true (byte fallback) with the ByteLevel pre-tokenizer");
  }
  if (const json* d = find(*model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    r.unsupported("model.dropout", shown(*d) + " (BPE dropout)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = find(*model, key); v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
      r.unsupported(std::string("model.") + key, shown(*v));
  spec.ignore_merges = r.flag(*model, "ignore_merges", false, "model");
  const json* vocab = find(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty())
    r.fail_at("model.vocab", "expected a non-empty object mapping token strings to ids");
  spec.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items())
    spec.vocab.emplace_back(token, r.id(id, "model.vocab['" + token + "']"));
  const json* merges = find(*model, "merges");
  if (merges == nullptr || !merges->is_array()) r.fail_at("model.merges", "expected an array");
  spec.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) spec.merges.push_back(parse_merge(r, (*merges)[i], i));
  std::sort(spec.vocab.begin(), spec.vocab.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
}

void parse_added_tokens(const Reader& r, const json& doc, HfBpeSpec& spec) {
  const json* added = find(doc, "added_tokens");
  if (added == nullptr) return;
  if (!added->is_array()) r.fail_at("added_tokens", "expected an array, got " + shown(*added));
  for (size_t i = 0; i < added->size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& t = (*added)[i];
    if (!t.is_object() || !t.contains("id")) r.fail_at(field, "expected an object with id and content");
    HfAddedToken a;
    a.id = r.id(t["id"], field + ".id");
    a.content = r.text(t, "content", field);
    a.special = r.flag(t, "special", false, field);
    a.lstrip = r.flag(t, "lstrip", false, field);
    a.rstrip = r.flag(t, "rstrip", false, field);
    a.single_word = r.flag(t, "single_word", false, field);
    a.normalized = r.flag(t, "normalized", !a.special, field);
    spec.added_tokens.push_back(std::move(a));
  }
}

// A Split step: one of the regexes split_patterns.h implements, Isolated.
SplitPattern parse_split(const Reader& r, const json& step, const std::string& field) {
  const json* pattern = find(step, "pattern");
  const json* regex = pattern && pattern->is_object() ? find(*pattern, "Regex") : nullptr;
  if (regex == nullptr || !regex->is_string())
    r.unsupported(field + ".pattern", pattern ? shown(*pattern) + " (a split on anything but a regex)" : "none");
  const std::optional<SplitPattern> known = split_pattern_of_regex(regex->get_ref<const std::string&>());
  if (!known) r.unsupported(field + ".pattern.Regex", shown(*regex) + " (a regex other than GPT-2's and Llama 3's)");
  if (const json* b = find(step, "behavior"); !b || *b != "Isolated")
    r.unsupported(field + ".behavior", b ? shown(*b) : "none");
  if (r.flag(step, "invert", false, field)) r.unsupported(field + ".invert", "true");
  return *known;
}

void parse_pre_tokenizer(const Reader& r, const json& doc, HfBpeSpec& spec) {
  const json* pre = find(doc, "pre_tokenizer");
  const auto steps = steps_of(r, *pre, "pre_tokenizer", "pretokenizers");
  if (steps.empty() || steps.size() > 2 || r.type(*steps.back().first, steps.back().second) != "ByteLevel")
    r.unsupported("pre_tokenizer", "a sequence that does not end in ByteLevel after at most one Split");
  const auto& [byte_level, field] = steps.back();
  spec.add_prefix_space = r.flag(*byte_level, "add_prefix_space", false, field);
  const bool use_regex = r.flag(*byte_level, "use_regex", true, field);
  if (steps.size() == 2) {
    const std::string& split_field = steps[0].second;
    const std::string type = r.type(*steps[0].first, split_field);
    if (type != "Split") r.unsupported(split_field + ".type", "'" + type + "'");
    if (use_regex) r.unsupported(field + ".use_regex", "true after a Split (two regexes)");
    spec.split = parse_split(r, *steps[0].first, split_field);
    spec.split_step = true;
  } else {
    spec.split = use_regex ? std::optional(SplitPattern::gpt2) : std::nullopt;
  }
}

// A Replace's String pattern and content, required to be `from` -> `to`.
void expect_replace(const Reader& r, const json& step, const std::string& field, const char* from, const char* to) {
  const json* pattern = find(step, "pattern");
  const json* str = pattern && pattern->is_object() ? find(*pattern, "String") : nullptr;
  if (str == nullptr || *str != from || r.text(step, "content", field) != to)
    r.unsupported(field, shown(step) + " (a Replace other than of '" + from + "' by '" + to + "')");
}

// The SentencePiece form's normalizer (Prepend ▁, then Replace space -> ▁;
// the Replace alone) or Metaspace pre-tokenizer.
void parse_spm_form(const Reader& r, const json& doc, HfSpmForm& form) {
  const json* norm = find(doc, "normalizer");
  const bool no_normalizer =
      norm == nullptr || (norm->is_object() && norm->value("type", "") == "Sequence" &&
                          norm->value("normalizers", json::array()).empty());
  if (const json* pre = find(doc, "pre_tokenizer")) {
    if (!no_normalizer) r.unsupported("normalizer", shown(*norm) + " (a normalizer before a Metaspace pre-tokenizer)");
    const std::string field = "pre_tokenizer";
    if (r.text(*pre, "replacement", field) != kMetaspace.data())
      r.unsupported(field + ".replacement", shown((*pre)["replacement"]) + " (a replacement other than ▁)");
    form.metaspace = true;
    form.split = r.flag(*pre, "split", true, field);
    if (const json* scheme = find(*pre, "prepend_scheme")) {
      const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
      if (s != "always" && s != "first" && s != "never")
        r.fail_at(field + ".prepend_scheme", "expected \"always\", \"first\" or \"never\", got " + shown(*scheme));
      form.prepend = s == "always" ? HfSpmForm::Prepend::always
                     : s == "first" ? HfSpmForm::Prepend::first
                                    : HfSpmForm::Prepend::none;
    } else {  // the older spelling
      form.prepend = r.flag(*pre, "add_prefix_space", true, field) ? HfSpmForm::Prepend::always : HfSpmForm::Prepend::none;
    }
  } else {
    if (no_normalizer)
      r.unsupported("pre_tokenizer", "none, with no normalizer (a BPE that neither a ByteLevel nor a Metaspace "
                                     "pre-tokenizer nor a normalizer gives its spaces)");
    const auto steps = steps_of(r, *norm, "normalizer", "normalizers");
    size_t k = 0;
    form.prepend = HfSpmForm::Prepend::none;
    if (steps.size() == 2) {
      const auto& [prepend, field] = steps[0];
      if (r.type(*prepend, field) != "Prepend" || r.text(*prepend, "prepend", field) != kMetaspace.data())
        r.unsupported(field, shown(*prepend) + " (a normalizer step other than Prepend(\"▁\") before the Replace)");
      form.prepend = HfSpmForm::Prepend::normalizer;
      k = 1;
    }
    if (steps.size() - k != 1 || r.type(*steps[k].first, steps[k].second) != "Replace")
      r.unsupported("normalizer", shown(*norm) + " (a normalizer other than [Prepend(\"▁\"),] Replace(\" \", \"▁\"))");
    expect_replace(r, *steps[k].first, steps[k].second, " ", kMetaspace.data());
  }
}

// The SentencePiece form's decoder: Replace(▁ -> space) or Metaspace,
// ByteFallback, Fuse, Strip of leading spaces.
void parse_spm_decoder(const Reader& r, const json& doc, HfSpmForm& form) {
  const json* decoder = find(doc, "decoder");
  if (decoder == nullptr) r.unsupported("decoder", "none (the ▁ of a SentencePiece-form BPE would stay in the text)");
  bool spaced = false, fused = false;
  form.decode_bytes = false;
  form.strip_spaces = 0;
  for (const auto& [step, field] : steps_of(r, *decoder, "decoder", "decoders")) {
    const std::string type = r.type(*step, field);
    if (type == "Replace") {
      expect_replace(r, *step, field, kMetaspace.data(), " ");
      spaced = true;
    } else if (type == "Metaspace") {
      if (r.text(*step, "replacement", field) != kMetaspace.data())
        r.unsupported(field + ".replacement", shown((*step)["replacement"]) + " (a replacement other than ▁)");
      const json* scheme = find(*step, "prepend_scheme");
      form.metaspace_decoder = scheme ? *scheme != "never" : r.flag(*step, "add_prefix_space", true, field);
      spaced = true;
    } else if (type == "ByteFallback") {
      form.decode_bytes = true;
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip") {
      const json* start = find(*step, "start");
      const json* stop = find(*step, "stop");
      if (!fused || r.text(*step, "content", field) != " " || (stop != nullptr && *stop != 0) || start == nullptr ||
          !start->is_number_unsigned() || start->get<uint64_t>() > 1024)
        r.unsupported(field, shown(*step) + " (a Strip other than of up to 1024 leading spaces, after Fuse)");
      form.strip_spaces = start->get<int32_t>();
    } else {
      r.unsupported(field + ".type", "'" + type + "'");
    }
  }
  if (!spaced) r.unsupported("decoder", shown(*decoder) + " (a decoder that does not turn ▁ into spaces)");
}

// TemplateProcessing's single template: [SpecialToken]? then Sequence A.
void parse_template(const Reader& r, const json& p, const std::string& field, HfBpeSpec& spec) {
  const json* single = find(p, "single");
  if (single == nullptr || !single->is_array()) r.fail_at(field + ".single", "expected an array");
  bool text_seen = false;
  for (const json& item : *single) {
    if (item.is_object() && item.contains("Sequence")) {
      text_seen = true;
      continue;
    }
    const json* special = item.is_object() ? find(item, "SpecialToken") : nullptr;
    if (special == nullptr || !special->is_object()) r.fail_at(field + ".single", "unexpected item " + shown(item));
    if (text_seen || spec.add_bos) r.unsupported(field + ".single", shown(*single) + " (special tokens but one BOS)");
    const std::string name = r.text(*special, "id", field + ".single[].SpecialToken");
    const json* tokens = find(p, "special_tokens");
    const json* entry = tokens && tokens->is_object() ? find(*tokens, name.c_str()) : nullptr;
    const json* ids = entry && entry->is_object() ? find(*entry, "ids") : nullptr;
    const std::string ids_field = field + ".special_tokens['" + name + "'].ids";
    if (ids == nullptr || !ids->is_array() || ids->size() != 1) r.fail_at(ids_field, "expected one id");
    spec.bos_id = r.id((*ids)[0], ids_field);
    spec.add_bos = true;
  }
}

void parse_post_processor(const Reader& r, const json& doc, HfBpeSpec& spec) {
  const json* post = find(doc, "post_processor");
  if (post == nullptr) return;
  for (const auto& [step, field] : steps_of(r, *post, "post_processor", "processors")) {
    const std::string type = r.type(*step, field);
    if (type == "TemplateProcessing") parse_template(r, *step, field, spec);
    else if (type != "ByteLevel") r.unsupported(field + ".type", "'" + type + "'");
  }
}

void parse_decoder(const Reader& r, const json& doc) {
  const json* decoder = find(doc, "decoder");
  if (decoder == nullptr) r.unsupported("decoder", "none (a BPE without the ByteLevel decoder)");
  const std::string type = r.type(*decoder, "decoder");
  if (type != "ByteLevel") r.unsupported("decoder.type", "'" + type + "'");
}

json parse_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": malformed JSON: ", e.what());
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in, path, ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  LOOM_REQUIRE(!in.bad(), path, ": cannot read");
  return os.str();
}

// The id of the token spelled `content`: an added token's, else model.vocab's; -1 if none.
int32_t id_of_content(const HfBpeSpec& spec, const std::string& content) {
  for (const HfAddedToken& t : spec.added_tokens)
    if (t.content == content) return t.id;
  for (const auto& [token, id] : spec.vocab)
    if (token == content) return id;
  return -1;
}

}  // namespace

HfBpeSpec parse_tokenizer_json(std::string_view json_text, const std::string& path) {
  const json doc = parse_json(json_text, path);
  LOOM_REQUIRE(doc.is_object(), path, ": expected a JSON object (a Hugging Face tokenizer.json)");
  const Reader r{path};
  HfBpeSpec spec;
  // The SentencePiece form: no pre-tokenizer (a normalizer writes the ▁) or a Metaspace one.
  const json* pre = find(doc, "pre_tokenizer");
  if (pre == nullptr || (pre->is_object() && pre->value("type", "") == "Metaspace")) spec.spm.emplace();
  parse_model(r, doc, spec);
  parse_added_tokens(r, doc, spec);
  if (spec.spm) {
    parse_spm_form(r, doc, *spec.spm);
    parse_spm_decoder(r, doc, *spec.spm);
  } else {
    if (const json* n = find(doc, "normalizer"))
      if (!(n->is_object() && n->value("type", "") == "Sequence" && n->value("normalizers", json::array()).empty()))
        r.unsupported("normalizer", shown(*n) + " (a normalizer with the ByteLevel pre-tokenizer)");
    parse_pre_tokenizer(r, doc, spec);
    parse_decoder(r, doc);
  }
  parse_post_processor(r, doc, spec);
  return spec;
}

void apply_tokenizer_config(HfBpeSpec& spec, std::string_view json_text, const std::string& path) {
  const json doc = parse_json(json_text, path);
  LOOM_REQUIRE(doc.is_object(), path, ": expected a JSON object (a Hugging Face tokenizer_config.json)");
  for (const char* key : {"eos_token", "bos_token"}) {
    const json* v = find(doc, key);
    if (v == nullptr) continue;
    const json* content = v->is_object() ? find(*v, "content") : v;
    LOOM_REQUIRE(content && content->is_string(), path, ": ", key,
                 ": expected a token's text, or an object with its \"content\", got ", shown(*v));
    const int32_t id = id_of_content(spec, content->get<std::string>());
    LOOM_REQUIRE(id >= 0, path, ": ", key, ": '", content->get<std::string>(), "' is not a token of the tokenizer");
    if (key[0] == 'e') spec.eos_id = id;
    else if (spec.bos_id < 0) spec.bos_id = id;
  }
}

HfTokenizer load_hf_tokenizer(const std::string& path) {
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / kHfTokenizerConfigFile;
  std::error_code ec;
  return load_hf_tokenizer(path, std::filesystem::is_regular_file(config, ec) ? config.string() : std::string());
}

HfTokenizer load_hf_tokenizer(const std::string& path, const std::string& config_path) {
  HfBpeSpec spec = parse_tokenizer_json(read_text_file(path), path);
  if (!config_path.empty()) apply_tokenizer_config(spec, read_text_file(config_path), config_path);
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>"}) {
    if (spec.eos_id >= 0) break;
    for (const HfAddedToken& t : spec.added_tokens)
      if (t.special && t.content == name) spec.eos_id = t.id;
  }
  return HfTokenizer::from_spec(std::move(spec), path);
}

}  // namespace loom::text
