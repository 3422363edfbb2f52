#!/usr/bin/python3
"""Reference cases for test_json_schema_grammar, judged by Python's jsonschema.

    ref_json_schema_grammar.py OUT_DIR
        writes OUT_DIR/json_schema_grammar_cases.json: schemas, each with
        instances jsonschema says are valid (serialized as json.dumps writes
        them, in three whitespace styles) and ones it says are invalid.
    ref_json_schema_grammar.py --validate FILE
        FILE: [{"schema": i, "texts": [...]}] sampled by the C++ test from
        the grammars; exits 1 naming every text that json.loads cannot read
        or jsonschema says is invalid.

Formats are checked: date and uuid by jsonschema's own checkers; time and
date-time (whose checker needs rfc3339-validator, not installed) by
RFC 3339's grammar below.
"""
import datetime
import json
import os
import re
import sys

import jsonschema

RFC3339_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@CHECKER.checks("time")
def _time(s):
    return not isinstance(s, str) or re.fullmatch(RFC3339_TIME, s, re.ASCII) is not None


@CHECKER.checks("date-time")
def _date_time(s):
    if not isinstance(s, str):
        return True
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)[Tt](.*)", s, re.ASCII)
    if not m or not re.fullmatch(RFC3339_TIME, m.group(2), re.ASCII):
        return False
    datetime.date.fromisoformat(m.group(1))  # raises for a day the month lacks
    return True


def is_valid(schema, instance):
    v = jsonschema.Draft202012Validator(schema, format_checker=CHECKER)
    try:
        return v.is_valid(instance)
    except ValueError:  # a checker that raises: invalid
        return False


TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                           "required": ["v"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}

# (schema, valid instances, invalid instances)
CASES = [
    ({"type": "string"}, ["", "a\"b\\c", "é日😀", "tab\there\n", "\u0001"], [1, None, ["x"]]),
    ({"type": "integer"}, [0, -7, 1234567890123456], [1.5, "1", True]),
    ({"type": "number"}, [0, -0.25, 1e10, 3.0e-5, 12345], ["1", None]),
    ({"type": ["string", "null"]}, ["x", None], [0, False]),
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name"], "additionalProperties": False},
     [{"name": "a"}, {"name": "a", "age": 3}, {"name": "b", "tags": ["x", "y"]}, {"name": "c", "age": 1, "tags": []}],
     [{}, {"age": 3}, {"name": 1}, {"name": "a", "x": 1}, {"name": "a", "age": "3"}]),
    ({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
      "additionalProperties": {"type": "boolean"}},
     [{"id": 1}, {"id": 2, "idx": True, "i": False, "": True}], [{"id": 1, "x": 1}, {"x": True}]),
    ({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"],
                                 "additionalProperties": False}, "minItems": 1, "maxItems": 3},
     [[{"x": 1}], [{"x": 1}, {"x": 2.5}, {"x": -3}]], [[], [{"x": 1}] * 4, [{"y": 1}]]),
    ({"enum": ["red", "green", 3, None, {"k": [1, "two"]}]}, ["red", 3, None, {"k": [1, "two"]}],
     ["blue", 4, {"k": [1]}]),
    ({"const": {"a": [True, False]}}, [{"a": [True, False]}], [{"a": [True]}, {"a": [True, False], "b": 1}]),
    ({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "integer", "minimum": 5, "maximum": 20}]},
     [0, 5, 7, 10, 15, 20], [-1, 21, 100]),
    ({"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}, {"type": "null"}]}, ["ab", 3, None],
     ["abc", 1.5, True]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer", "minimum": 1}}, "required": ["b"]}]},
     [{"a": "x", "b": 1}], [{"a": "x"}, {"a": "x", "b": 0}, {"b": 2}]),
    (TREE, [{"v": 1}, {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}],
     [{"v": 1, "kids": [{}]}, {"kids": []}, {"v": 1, "kids": [{"v": "x"}]}]),
    ({"type": "integer", "exclusiveMinimum": -120, "maximum": 4095},
     [-119, -1, 0, 9, 10, 99, 100, 999, 1000, 4095], [-120, -500, 4096, 10000]),
    ({"type": "string", "minLength": 2, "maxLength": 4}, ["ab", "日本語", "abcd", "a\"\\b"], ["a", "abcde", ""]),
    ({"type": "string", "pattern": "^[A-Z][a-z]+(-[A-Z][a-z]+)*$"}, ["Ab", "Jean-Luc"], ["ab", "Ab-", "A", "Jean-luc"]),
    ({"type": "string", "pattern": "\\d{3}"}, ["123", "ab1234", "x000y"], ["12", "a1b2c3"]),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                       "t": {"type": "string", "format": "time"},
                                       "dt": {"type": "string", "format": "date-time"},
                                       "u": {"type": "string", "format": "uuid"}}, "additionalProperties": False},
     [{"d": "2024-02-29"}, {"d": "2000-02-29", "t": "23:59:60Z"}, {"t": "08:30:00.123+05:30"},
      {"dt": "1999-12-31T23:59:59z"}, {"u": "123e4567-e89b-12d3-a456-426614174000"}, {}],
     [{"d": "2023-02-29"}, {"d": "1900-02-29"}, {"d": "2024-13-01"}, {"t": "24:00:00Z"}, {"t": "12:00:00"},
      {"dt": "2024-01-01 10:00:00Z"}, {"u": "123e4567e89b12d3a456426614174000"}]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False, "minItems": 1},
     [["a"], ["a", True]], [[], [1], ["a", True, 3]]),
    # allOf inside an allOf member, directly and through a $ref: flattened.
    ({"allOf": [{"allOf": [{"type": "object", "properties": {"a": {"enum": ["yes", "no"]}}, "required": ["a"]}]},
                {"allOf": [{"properties": {"b": {"type": "integer"}}}]}]},
     [{"a": "yes"}, {"a": "no", "b": 2}], [{"a": "maybe"}, {"b": 1}, {"a": "yes", "b": "x"}, 1]),
    ({"$defs": {"b": {"allOf": [{"const": "yes"}]}}, "allOf": [{"$ref": "#/$defs/b"}]}, ["yes"], ["no", 2]),
    ({}, [None, 1, "x", [1, {"a": {}}], {"k": [True]}], []),
    ({"type": "object"}, [{}, {"a": 1, "b": [None]}], [[], "x"]),
]

STYLES = [{"ensure_ascii": False}, {"ensure_ascii": False, "separators": (",", ":")},
          {"ensure_ascii": False, "indent": 2}]


def write_cases(out_dir):
    cases = []
    for i, (schema, valid, invalid) in enumerate(CASES):
        jsonschema.Draft202012Validator.check_schema(schema)
        for x in valid:
            assert is_valid(schema, x), (i, x)
        for x in invalid:
            assert not is_valid(schema, x), (i, x)
        cases.append({"schema": schema,
                      "valid": [json.dumps(x, **style) for x in valid for style in STYLES],
                      "invalid": [json.dumps(x, **style) for x in invalid for style in STYLES]})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "json_schema_grammar_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"validator": os.path.abspath(__file__), "cases": cases}, f, ensure_ascii=False)


def validate(path):
    with open(path, encoding="utf-8") as f:
        walks = json.load(f)
    bad = 0
    for w in walks:
        schema = CASES[w["schema"]][0]
        for text in w["texts"]:
            try:
                ok = is_valid(schema, json.loads(text))
            except ValueError:
                ok = False
            if not ok:
                bad += 1
                print(f"schema {w['schema']}: invalid sample {text!r}")
    print(f"{sum(len(w['texts']) for w in walks)} samples, {bad} invalid")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--validate":
        sys.exit(validate(sys.argv[2]))
    write_cases(sys.argv[1])
