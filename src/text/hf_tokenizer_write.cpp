// Writing tokenizer.json and tokenizer_config.json (hf_tokenizer_json.h), in
// the form and key order of the files the `tokenizers` library writes.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/hf_tokenizer_json.h"

namespace loom::text {
namespace {

using nlohmann::ordered_json;

ordered_json byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

ordered_json added_token_fields(const HfAddedToken& t) {
  return {{"content", t.content},    {"single_word", t.single_word}, {"lstrip", t.lstrip},
          {"rstrip", t.rstrip},      {"normalized", t.normalized},   {"special", t.special}};
}

ordered_json pre_tokenizer(const HfBpeSpec& spec) {
  if (!spec.split_step) return byte_level(spec.add_prefix_space, true, spec.split.has_value());
  const ordered_json split = {{"type", "Split"},
                              {"pattern", {{"Regex", split_pattern_regex(*spec.split)}}},
                              {"behavior", "Isolated"},
                              {"invert", false}};
  return {{"type", "Sequence"}, {"pretokenizers", {split, byte_level(spec.add_prefix_space, true, false)}}};
}

ordered_json replace(const char* from, const char* to) {
  return {{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
}

// The SentencePiece form's normalizer, pre-tokenizer and decoder, as
// transformers' LlamaConverter writes them.
ordered_json spm_normalizer(const HfSpmForm& form) {
  if (form.metaspace) return nullptr;
  ordered_json steps = ordered_json::array();
  if (form.prepend == HfSpmForm::Prepend::normalizer)
    steps.push_back({{"type", "Prepend"}, {"prepend", kMetaspace.data()}});
  steps.push_back(replace(" ", kMetaspace.data()));
  return {{"type", "Sequence"}, {"normalizers", std::move(steps)}};
}

ordered_json spm_pre_tokenizer(const HfSpmForm& form) {
  if (!form.metaspace) return nullptr;
  const char* scheme = form.prepend == HfSpmForm::Prepend::always  ? "always"
                       : form.prepend == HfSpmForm::Prepend::first ? "first"
                                                                   : "never";
  return {{"type", "Metaspace"}, {"replacement", kMetaspace.data()}, {"prepend_scheme", scheme}, {"split", form.split}};
}

ordered_json spm_decoder(const HfSpmForm& form) {
  ordered_json steps = ordered_json::array();
  if (form.metaspace_decoder)
    steps.push_back({{"type", "Metaspace"}, {"replacement", kMetaspace.data()}, {"prepend_scheme", "always"}, {"split", true}});
  else
    steps.push_back(replace(kMetaspace.data(), " "));
  if (form.decode_bytes) steps.push_back({{"type", "ByteFallback"}});
  steps.push_back({{"type", "Fuse"}});
  if (form.strip_spaces > 0) steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", form.strip_spaces}, {"stop", 0}});
  return {{"type", "Sequence"}, {"decoders", std::move(steps)}};
}

// BOS before the text, as Llama 3's and Llama 2's (pairs: BOS A BOS B, type
// ids 0 and 1); the byte-level form's ByteLevel first.
ordered_json post_processor(const HfTokenizer& tok) {
  const bool byte_level_form = !tok.spec().spm;
  const ordered_json byte_level_post = byte_level_form ? byte_level(true, false, true) : ordered_json(nullptr);
  if (!tok.add_bos() || tok.bos_id() < 0) return byte_level_post;
  const std::string& bos = tok.token_strings()[tok.bos_id()];
  const auto special = [&](int type_id) { return ordered_json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}}; };
  const auto sequence = [](const char* id, int type_id) {
    return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  const ordered_json processing = {
      {"type", "TemplateProcessing"},
      {"single", {special(0), sequence("A", 0)}},
      {"pair", {special(0), sequence("A", 0), special(1), sequence("B", 1)}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {tok.bos_id()}}, {"tokens", {bos}}}}}}};
  if (!byte_level_form) return processing;
  return {{"type", "Sequence"}, {"processors", {byte_level_post, processing}}};
}

ordered_json model(const HfBpeSpec& spec) {
  ordered_json vocab = ordered_json::object();
  auto& entries = vocab.get_ref<ordered_json::object_t&>();  // a vector: appending skips operator[]'s linear search
  entries.reserve(spec.vocab.size());
  for (const auto& [token, id] : spec.vocab) entries.emplace_back(token, id);
  // "a b" as the older `tokenizers` releases read them, unless a token holds a space.
  const bool as_strings = std::none_of(spec.merges.begin(), spec.merges.end(), [](const auto& m) {
    return m.first.find(' ') != std::string::npos || m.second.find(' ') != std::string::npos;
  });
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : spec.merges) {
    if (as_strings) merges.push_back(left + " " + right);
    else merges.push_back({left, right});
  }
  const bool spm = spec.spm.has_value();
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", spm && !spec.spm->unk_token.empty() ? ordered_json(spec.spm->unk_token) : ordered_json(nullptr)},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", spm && spec.spm->fuse_unk},
          {"byte_fallback", spm && spec.spm->byte_fallback},
          {"ignore_merges", spec.ignore_merges},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

std::string dump(const ordered_json& j, const char* what) {
  try {
    return j.dump(2) + "\n";
  } catch (const ordered_json::exception& e) {
    fail("cannot write ", what, ": ", e.what(), " (a token is not valid UTF-8)");
  }
}

}  // namespace

std::string tokenizer_json_text(const HfTokenizer& tok) {
  const HfBpeSpec& spec = tok.spec();
  ordered_json added = ordered_json::array();
  for (const HfAddedToken& t : spec.added_tokens) {
    ordered_json entry = {{"id", t.id}};
    entry.update(added_token_fields(t));
    added.push_back(std::move(entry));
  }
  ordered_json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", std::move(added)},
                    {"normalizer", spec.spm ? spm_normalizer(*spec.spm) : nullptr},
                    {"pre_tokenizer", spec.spm ? spm_pre_tokenizer(*spec.spm) : pre_tokenizer(spec)},
                    {"post_processor", post_processor(tok)},
                    {"decoder", spec.spm ? spm_decoder(*spec.spm) : byte_level(true, true, true)},
                    {"model", model(spec)}};
  return dump(j, kHfTokenizerFile);
}

std::string tokenizer_config_json_text(const HfTokenizer& tok, const TokenizerConfigExtras& extras) {
  const auto name = [&](int32_t id) { return id >= 0 ? ordered_json(tok.token_strings()[id]) : ordered_json(nullptr); };
  ordered_json added = ordered_json::object();
  for (const HfAddedToken& t : tok.spec().added_tokens) added[std::to_string(t.id)] = added_token_fields(t);
  ordered_json j = {{"add_bos_token", tok.add_bos()},
                    {"add_eos_token", false},
                    {"added_tokens_decoder", std::move(added)},
                    {"bos_token", name(tok.bos_id())},
                    {"clean_up_tokenization_spaces", false},
                    {"eos_token", name(tok.eos_id())}};
  if (extras.model_max_length > 0) j["model_max_length"] = extras.model_max_length;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (!extras.chat_template.empty()) j["chat_template"] = extras.chat_template;
  return dump(j, kHfTokenizerConfigFile);
}

}  // namespace loom::text
