// Constrained decoding in the engine: a random model sampled at temperature
// 1 under a JSON schema's grammar writes, in every sequence (n = 2 forks
// too), JSON that nlohmann's parser reads and that meets the schema, ended
// by EOS; a request's tokens are the same alone and in a batch (the mask
// keeps batch invariance); without the grammar the same model writes no
// JSON; a grammar without an end token is refused.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/tensors.h"
#include "core/error.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "infer/json_schema_grammar.h"
#include "model/params.h"

namespace loom::infer {
namespace {

constexpr int32_t kEos = 511;

// 512 tokens: printable ASCII one character each, JSON-ish pieces, random
// two-to-four character pieces, a two-byte and a three-byte character, and
// EOS (no bytes).
std::vector<std::string> vocabulary() {
  std::vector<std::string> v;
  for (char c = 32; c < 127; ++c) v.emplace_back(1, c);
  for (const char* piece : {"{\"", "\":", "\", \"", "\"name\"", "\"age\"", "\"tags\"", "\"ok\"", "true", "false",
                            "null", "12", "\\n", "\\\"", "\n", "\n  ", "é", "日本", ", ", ": ", "[\"", "\"]", "}"})
    v.emplace_back(piece);
  std::mt19937 rng(5);
  while (v.size() < kEos) {
    std::string s;
    for (int i = 0, n = 2 + static_cast<int>(rng() % 3); i < n; ++i) s += static_cast<char>(32 + rng() % 95);
    v.push_back(s);
  }
  v.emplace_back();  // EOS
  return v;
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 8},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
  "ok": {"type": "boolean"}}, "required": ["name", "age"]})";

// The schema's rules checked by hand on a parsed value.
bool meets_schema(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("name") || !j.contains("age")) return false;
  for (const auto& [k, v] : j.items()) {
    if (k == "name" && !(v.is_string() && v.get<std::string>().size() <= 8 * 4)) return false;
    if (k == "age" && !(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 150)) return false;
    if (k == "ok" && !v.is_boolean()) return false;
    if (k == "tags" && !(v.is_array() && v.size() <= 3 &&
                         std::all_of(v.begin(), v.end(), [](const auto& t) { return t == "a" || t == "b"; })))
      return false;
    if (k != "name" && k != "age" && k != "ok" && k != "tags") return false;
  }
  return true;
}

struct Fixture {
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  Pools pools;
  OwnedTensor params;
  std::shared_ptr<const TokenGrammar> grammar;
  Fixture() {
    cfg.max_seq_len = 256;
    const std::vector<model::ParamSpec> specs = model::param_specs(cfg);
    params = pools[MemTag::params].empty(DType::f32, {model::param_count(specs)});
    model::init_params(params, specs, 3);
    grammar = std::make_shared<TokenGrammar>(
        TokenGrammar{parse_gbnf(json_schema_to_gbnf_ordered(nlohmann::ordered_json::parse(kSchema))),
                     std::make_shared<GrammarVocab>(vocabulary())});
  }
  GenerationParams params_for(uint64_t seed, bool constrained) const {
    GenerationParams p{.sampler = {.temperature = 1.f, .seed = seed}, .stop = {.max_tokens = 160, .eos_token_ids = {kEos}},
                       .n = 2};
    if (constrained) p.grammar = grammar;
    return p;
  }
};

std::string text_of(const std::vector<int32_t>& tokens) {
  static const std::vector<std::string> v = vocabulary();
  std::string s;
  for (int32_t t : tokens) s += v.at(static_cast<size_t>(t));
  return s;
}

std::vector<int32_t> prompt(int64_t salt) { return {static_cast<int32_t>(salt % 100), 7, 42, static_cast<int32_t>(salt)}; }

TEST(EngineGrammar, EverySampledOutputIsJsonThatMeetsTheSchema) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 8, .max_num_batched_tokens = 64, .max_num_seqs = 16});
  int64_t outputs = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    const auto out = engine.generate({prompt(static_cast<int64_t>(seed)), prompt(100 + static_cast<int64_t>(seed))},
                                     f.params_for(seed, true));
    for (const auto& per_prompt : out)
      for (const GenerationOutput& o : per_prompt) {
        ++outputs;
        ASSERT_EQ(o.finish, FinishReason::stop) << text_of(o.tokens);
        ASSERT_EQ(o.tokens.back(), kEos);
        const std::string text = text_of(o.tokens);
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << "not JSON: " << text;
        EXPECT_TRUE(meets_schema(j)) << text;
      }
  }
  EXPECT_EQ(outputs, 48);
}

TEST(EngineGrammar, ARequestsTokensAreTheSameAloneAndInABatch) {
  Fixture f;
  std::vector<int32_t> alone;
  {
    Engine engine(f.cfg, f.params, f.pools, {.block_size = 8, .max_num_batched_tokens = 64});
    alone = engine.generate({prompt(3)}, f.params_for(77, true))[0][1].tokens;
  }
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 8, .max_num_batched_tokens = 64});
  std::vector<RequestId> ids;
  for (int64_t k = 0; k < 5; ++k) ids.push_back(engine.add_request(prompt(10 + k), f.params_for(k, k % 2 == 0)));
  const RequestId mine = engine.add_request(prompt(3), f.params_for(77, true));
  std::vector<int32_t> batched;
  while (engine.has_unfinished())
    for (const TokenEvent& e : engine.step())
      if (e.request == mine && e.index == 1) batched.push_back(e.token);
  EXPECT_EQ(batched, alone);
}

TEST(EngineGrammar, WithoutTheGrammarTheModelWritesNoJson) {
  Fixture f;
  Engine engine(f.cfg, f.params, f.pools, {.block_size = 8, .max_num_batched_tokens = 64});
  const auto out = engine.generate({prompt(1)}, f.params_for(1, false));
  for (const GenerationOutput& o : out[0])
    EXPECT_TRUE(nlohmann::json::parse(text_of(o.tokens), nullptr, false).is_discarded()) << text_of(o.tokens);
}

TEST(EngineGrammar, AGrammarNeedsAnEndToken) {
  Fixture f;
  GenerationParams p = f.params_for(1, true);
  p.stop.ignore_eos = true;
  EXPECT_THROW(p.validate(), loom::Error);
  p.stop.stop_token_ids = {kEos};
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace loom::infer
