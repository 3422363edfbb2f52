// JSON schema -> GBNF, judged by Python's jsonschema: the instances it calls
// valid (as json.dumps writes them) are accepted, the ones it calls invalid
// are not; texts sampled at random from each grammar are all valid (checked
// by tests/ref/ref_json_schema_grammar.py --validate); refused keywords name
// their schema path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "core/error.h"
#include "infer/grammar.h"
#include "infer/json_schema_grammar.h"

using namespace loom::infer;
using Json = nlohmann::ordered_json;

namespace {

Json ref_cases() {
  std::ifstream f(std::string(LOOM_REF_DIR) + "/json_schema_grammar_cases.json");
  if (!f) throw std::runtime_error("missing json_schema_grammar_cases.json: run tests/ref/ref_json_schema_grammar.py");
  return Json::parse(f);
}

bool accepts_whole(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_end();
}

std::string error_of(const char* schema) {
  try {
    json_schema_to_gbnf_ordered(Json::parse(schema));
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// One text drawn from g: random allowed tokens of vocab (closing tokens
// weighted up so that walks end), stopping at a whole value with
// probability 1/3 per step. Empty when it has not ended within the cap.
std::string sample(const std::shared_ptr<const Grammar>& g, const std::vector<std::string>& vocab, const TokenTrie& trie,
                   const std::vector<double>& weight, std::mt19937& rng) {
  GrammarMatcher m(g);
  std::string text;
  std::vector<uint8_t> mask;
  std::vector<double> w(vocab.size());
  for (int step = 0; step < 600; ++step) {
    if (m.can_end() && (!m.can_continue() || rng() % 3 == 0)) return text;
    allowed_tokens(m, trie, mask);
    for (size_t t = 0; t < vocab.size(); ++t) w[t] = mask[t] ? weight[t] : 0.0;
    std::discrete_distribution<size_t> pick(w.begin(), w.end());
    const size_t t = pick(rng);
    if (!mask[t] || !m.accept(vocab[t])) ADD_FAILURE() << "allowed token refused: " << vocab[t];
    text += vocab[t];
  }
  return "";
}

}  // namespace

TEST(JsonSchemaGrammar, AcceptsWhatJsonschemaCallsValidAndRejectsTheRest) {
  const Json ref = ref_cases();
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const Json& c = ref["cases"][i];
    const std::string gbnf = json_schema_to_gbnf_ordered(c["schema"]);
    const auto g = parse_gbnf(gbnf);
    for (const Json& v : c["valid"]) EXPECT_TRUE(accepts_whole(g, v.get<std::string>())) << "schema " << i << ": " << v << "\n" << gbnf;
    for (const Json& v : c["invalid"]) EXPECT_FALSE(accepts_whole(g, v.get<std::string>())) << "schema " << i << ": " << v << "\n" << gbnf;
  }
}

TEST(JsonSchemaGrammar, RandomWalksAreValidForJsonschema) {
  const Json ref = ref_cases();
  std::vector<std::string> vocab, closers = {"\"", "}", "]", ",", "0", "1", "true", "null", "Z", "-", "\"a\""};
  for (char c = ' '; c <= '~'; ++c) vocab.push_back(std::string(1, c));
  for (const char* t : {"é", "日本", "😀", "\xE6", "\x97\xA5", "\\n", "\\u00e9", "\\ud83d\\ude00", "\\\"", "true", "false",
                        "null", "\"a\"", "\n", "\n  ", "\t", "12", "2024-02-", "29", "T23:59:", "kids", "name", "-1"})
    vocab.push_back(t);
  std::vector<double> weight(vocab.size(), 1.0);
  for (size_t t = 0; t < vocab.size(); ++t)
    if (std::find(closers.begin(), closers.end(), vocab[t]) != closers.end()) weight[t] = 25.0;
  const TokenTrie trie(vocab);
  std::mt19937 rng(5);
  Json walks = Json::array();
  size_t n = 0;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const auto g = parse_gbnf(json_schema_to_gbnf_ordered(ref["cases"][i]["schema"]));
    Json texts = Json::array();
    for (int k = 0; k < 40; ++k)
      if (std::string s = sample(g, vocab, trie, weight, rng); !s.empty()) texts.push_back(s);
    EXPECT_GE(texts.size(), 10u) << "schema " << i << ": too few walks ended";
    n += texts.size();
    walks.push_back({{"schema", i}, {"texts", texts}});
  }
  const std::string path = std::string(LOOM_REF_DIR) + "/json_schema_grammar_walks.json";
  std::ofstream(path) << walks.dump();
  const std::string cmd = "/usr/bin/python3 " + ref["validator"].get<std::string>() + " --validate " + path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << n << " samples in " << path;
}

TEST(JsonSchemaGrammar, WhitespaceAndNumbersAreBounded) {
  const auto g = parse_gbnf(json_schema_to_gbnf_ordered(Json::parse(R"({"type": "array", "items": {"type": "number"}})")));
  EXPECT_TRUE(accepts_whole(g, "[\n" + std::string(20, ' ') + "1]"));
  EXPECT_FALSE(GrammarMatcher(g).accept("[\n" + std::string(21, ' ')));
  EXPECT_FALSE(GrammarMatcher(g).accept("[  "));
  EXPECT_TRUE(accepts_whole(g, "[1234567890123456.1234567890123456e-99]"));
  EXPECT_FALSE(GrammarMatcher(g).accept("[1e999"));  // past double's range
  EXPECT_FALSE(GrammarMatcher(g).accept("[12345678901234567"));
  EXPECT_FALSE(GrammarMatcher(g).accept("[1.12345678901234567"));
  EXPECT_FALSE(accepts_whole(g, " [1]"));  // none before the top value
}

TEST(JsonSchemaGrammar, EmptyPropertiesMeanAnEmptyObject) {
  // How a tool without arguments is declared: only {} (with blanks) is allowed.
  const auto none = parse_gbnf(json_schema_to_gbnf_ordered(Json::parse(R"({"type": "object", "properties": {}})")));
  EXPECT_TRUE(accepts_whole(none, "{}"));
  EXPECT_TRUE(accepts_whole(none, "{ }"));
  EXPECT_FALSE(GrammarMatcher(none).accept("{\""));
  const auto any = parse_gbnf(json_schema_to_gbnf_ordered(Json::parse(R"({"type": "object"})")));
  EXPECT_TRUE(accepts_whole(any, R"({"a": 1})"));
}

TEST(JsonSchemaGrammar, SchemasComposeInOneGrammarText) {
  const Json params = Json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  const std::string text = "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"f\\\", \\\"arguments\\\": \" f-args \"}\\n</tool_call>\"\n" +
                           json_schema_to_gbnf_ordered(params, "f-args") +
                           json_schema_to_gbnf(nlohmann::json::parse(R"({"type": "integer"})"), "g-args");
  const auto g = parse_gbnf(text);
  EXPECT_TRUE(accepts_whole(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts_whole(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"));
}

TEST(JsonSchemaGrammar, RefusedKeywordsNameTheSchemaPath) {
  EXPECT_EQ(error_of(R"({"properties": {"a": {"type": "array", "items": {"type": "integer", "multipleOf": 3}}}})"),
            "schema at /properties/a/items: keyword 'multipleOf' cannot be enforced by the grammar");
  EXPECT_EQ(error_of(R"({"type": "number", "minimum": 0})"),
            "schema at /: 'minimum' on a number cannot be enforced (only on integers: use type integer)");
  EXPECT_EQ(error_of(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"),
            "schema at /: oneOf whose branches may overlap cannot be enforced (use anyOf, or branches of distinct types or values)");
  EXPECT_EQ(error_of(R"({"type": "string", "format": "email"})"),
            "schema at /: format 'email' cannot be enforced (supported: date, time, date-time, uuid)");
  EXPECT_EQ(error_of(R"j({"type": "string", "pattern": "a(?=b)"})j"),
            "schema at /: pattern 'a(?=b)' at offset 3: only (?: ) groups: no lookaround or named groups");
  EXPECT_EQ(error_of(R"({"$ref": "http://x/y.json"})"), "schema at /: $ref 'http://x/y.json': only references into this schema (#/...)");
  EXPECT_EQ(error_of(R"({"$defs": {"a": {"type": "string", "uniqueItems": true}}, "$ref": "#/$defs/a"})"),
            "schema at /$defs/a: keyword 'uniqueItems' cannot be enforced by the grammar");
  EXPECT_EQ(error_of(R"({"type": "string", "minLength": 3, "maxLength": 2})"), "schema at /: maxLength < minLength: no string is valid");
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}]})"),
            "schema at /: anyOf with 'type' beside it cannot be enforced (move it into each branch)");
  EXPECT_EQ(error_of("false"), "schema at /: the schema false allows no value");
}
