// Structured output: what a request asks its answer to look like, as the
// grammar constrained decoding follows (infer/token_grammar.h), so the
// answer always parses:
//
//   OpenAI   response_format {"type": "json_object"} (any JSON object) or
//            {"type": "json_schema", "json_schema": {"name", "schema", "strict"?}}
//   vLLM     guided_json (a schema), guided_choice (a list of strings),
//            guided_grammar (GBNF text, llama.cpp's syntax)
//   ollama   format "json" or a schema (mapped onto response_format)
//   tools    tool_choice "required" or {"type": "function", "function":
//            {"name"}}: a call in the template's own form (tool_calls.h),
//            its arguments following the function's parameters schema
//
// Bad schemas and grammars are 400s naming the field and what cannot be
// enforced (json_schema_grammar.h lists what can).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/token_grammar.h"
#include "serve/tool_calls.h"

namespace loom::serve {

// The GBNF text body asks for with response_format or guided_*, "" for
// none; ApiError (400) for an unknown type, a malformed field, or two of
// them at once. The field used is written to param. answer_prefix: text the
// answer starts with before what the schema or choices describe (harmony's
// final-channel header); a guided_grammar is taken as the client wrote it.
std::string requested_grammar(const nlohmann::ordered_json& body, std::string& param,
                              const std::string& answer_prefix = "");

// A grammar for calls of the named tools (tools: the request's list) in
// format f: one call, or with parallel up to four (harmony: one, which ends
// the answer).
std::string tool_call_grammar(ToolFormat f, const nlohmann::ordered_json& tools, const std::vector<std::string>& names,
                              bool parallel);

// gbnf compiled for the model's vocabulary; ApiError (400, param) when it
// does not compile, 400 when the model has no vocabulary for grammars.
std::shared_ptr<const infer::TokenGrammar> compile_grammar(const std::string& gbnf,
                                                           std::shared_ptr<const infer::GrammarVocab> vocab,
                                                           const std::string& param);

// A GBNF literal ("...", escaped) matching exactly text.
std::string gbnf_literal(std::string_view text);

}  // namespace loom::serve
