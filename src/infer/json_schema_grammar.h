// JSON schema -> GBNF rules for constrained decoding (the idea of
// llama.cpp's json-schema-to-grammar; our own code). The rule named
// root_name matches exactly the JSON texts of the grammar's form that are
// valid for the schema. The form:
//  * whitespace only after a value and after '{' '[' ',' ':', at most one
//    space or a newline and 20 spaces/tabs there, so a sampled model cannot
//    run forever inside whitespace; none before a value at the top;
//  * numbers with at most 16 integer digits, 16 fraction digits and 2
//    exponent digits (so every number is a finite double: 1e999 would be
//    Infinity to JavaScript's JSON.parse); integers without fraction or
//    exponent;
//  * strings: any UTF-8 or escape JSON allows (\" \\ \/ \b \f \n \r \t
//    \uXXXX, surrogates only as a pair), never a raw control character;
//    strings fixed by const/enum/pattern/format use Python's json.dumps
//    (ensure_ascii=False) form: raw UTF-8, escapes only where needed;
//  * objects list the declared properties in schema order (required ones
//    always, optional ones maybe), then any additional ones.
// additionalProperties absent on a schema with properties or required means
// no other properties (a model should not invent keys); on a schema with
// neither, any object. Helper rules are named root_name + "-..." so several
// schemas can share one grammar text.
//
// Supported: type (one or a list), enum, const, properties, required,
// additionalProperties (bool or schema), anyOf, oneOf (only where its
// branches provably exclude each other: distinct JSON types, or distinct
// const/enum values), allOf of object schemas (merged), $ref to "#/..."
// (recursion allowed), items, prefixItems, minItems, maxItems, minLength,
// maxLength, pattern (literal characters, classes, ., \d \w \s, groups, |,
// * + ? {m,n}, ^ and $ at the ends of top-level alternatives), format date,
// time, date-time, uuid, and minimum/maximum/exclusiveMinimum/
// exclusiveMaximum on integers. Anything else that validates (multipleOf,
// uniqueItems, not, if/then/else, number bounds, ...) is a loom::Error
// naming the schema path ("schema at /properties/a/items: ..."); the
// annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly) are ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace loom::infer {

std::string json_schema_to_gbnf(const nlohmann::json& schema, const std::string& root_name = "root");
// The same, keeping the order of "properties" as written (nlohmann::json
// sorts object keys; parse the schema with nlohmann::ordered_json to keep it).
std::string json_schema_to_gbnf_ordered(const nlohmann::ordered_json& schema, const std::string& root_name = "root");

}  // namespace loom::infer
