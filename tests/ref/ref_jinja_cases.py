"""Published chat templates and a peer's test cases rendered by the real jinja2, for test_jinja_cases.

The inputs live outside the repository, in ../shared/jinja-cases/ (see its README.md): 35 chat
templates byte for byte as Hugging Face ships them (templates/*.jinja, with their models' bos/eos
tokens in templates.json) and peer.json, the cases of @huggingface/jinja's own test suite whose
context is plain JSON. LOOM_JINJA_CASES names another folder; where there is none the output says
why ({"missing": reason, "cases": []}) and the C++ test skips.

Debian's python3-jinja2 (3.1) renders everything in the environment transformers' (4.4x)
_compile_jinja_template builds: ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True) with loopcontrols and the {% generation %} tag, tojson as json.dumps without
sorting keys or escaping HTML, raise_exception and strftime_now (at a fixed instant, recorded as
"now_unix" for the C++ side). Variables are what apply_chat_template passes: messages, tools (None
without tools), documents (None), add_generation_prompt, and the special tokens the tokenizer has.
Every dict keeps a deliberate, unsorted insertion order: jinja2 iterates dicts as Python does.

Two groups of cases:
  * published: every template on several conversations (more with tools where the template
    uses them), add_generation_prompt true and false. "error" is raise_exception's message when
    the template raises, else "" (any error), with jinja2's message in "note".
  * peer: the peer.json cases that jinja2 passes (its output equals the expected one, or it
    raises where an error is expected), with the case's own trim_blocks/lstrip_blocks; the
    others expect JavaScript's rendering, and jinja2 is the reference.

Output (in argv[1]): jinja_cases.json
  {"jinja2": version, "cases": [{"group", "name", "template",
    "options": {"trim_blocks", "lstrip_blocks", "keep_trailing_newline"}, "now_unix",
    "variables", and "expected" (the output) or "error" (a substring; "" for any)}]}
"""
import calendar
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime(2026, 11, 28, 10, 20, 30)  # what strftime_now() formats, read as UTC


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What transformers' raise_exception global raises."""


def raise_exception(message):
    raise RaisedByTemplate(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter: no HTML escaping, keys in insertion order."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}: renders its body (the tracking of
    assistant tokens it adds when asked for a mask changes no output)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_assistant"), [], [], body).set_lineno(lineno)

    def _render_assistant(self, caller):
        return caller()


def environment(options, now):
    env = ImmutableSandboxedEnvironment(trim_blocks=options["trim_blocks"], lstrip_blocks=options["lstrip_blocks"],
                                        keep_trailing_newline=options["keep_trailing_newline"],
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)
    return env


COMPILED = {}  # (template, options, now) -> jinja2.Template: each published template is compiled once


def render(template, options, now, variables):
    """(output, None) or (None, the exception)."""
    try:
        key = (template, tuple(options.values()), now)
        if key not in COMPILED:
            COMPILED[key] = environment(options, now).from_string(template)
        return COMPILED[key].render(**variables), None
    except Exception as e:  # jinja2 raises TemplateError and Python's own errors alike
        return None, e


def unix(dt):
    return calendar.timegm(dt.utctimetuple())


# --- Conversations (keys in insertion order, deliberately unsorted) ----------

def msg(role, content):
    return {"role": role, "content": content}


SYSTEM = msg("system", "You are a helpful assistant.")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a place.",
        "parameters": {"type": "object", "properties": {
            "zip": {"type": "string", "description": "The postal code, if known."},
            "city": {"type": "string", "description": "The city, e.g. Paris."},
            "units": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature units."},
        }, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_table",
        "description": "Book a table at a restaurant.",
        "parameters": {"type": "object", "properties": {
            "time": {"type": "string", "description": "When, as HH:MM."},
            "party": {"type": "object", "description": "Who is coming.", "properties": {
                "size": {"type": "integer", "description": "How many people."},
                "names": {"type": "array", "items": {"type": "string"}, "description": "Their names."},
            }, "required": ["size"], "additionalProperties": {"type": "string"}},
            "restaurant": {"type": "string", "description": "The restaurant's name."},
        }, "required": ["restaurant", "time"]}}},
]

ARGUMENTS = {"zip": "75001", "city": "Paris", "units": "celsius"}


def tool_call_turns(call_id, arguments, content, final):
    """user, an assistant tool call, the tool's result, and final (a last turn)."""
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [msg("user", "What is the weather in Paris?"),
            {"role": "assistant", "content": content, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "name": "get_weather",
             "content": '{"temperature": 21, "condition": "sunny"}'},
            final]


CONVERSATIONS = {
    "user": [msg("user", "Hello!")],
    "system-user": [SYSTEM, msg("user", "What is 2 + 2?")],
    "multi-turn": [SYSTEM, msg("user", "What is 2 + 2?"), msg("assistant", "2 + 2 = 4."),
                   msg("user", "And 3 + 3?")],
    "assistant-last": [msg("user", "What is 2 + 2?"), msg("assistant", "4")],
    "unicode-html": [msg("system", "café — naïve ✓"), msg("user", "<b>&amp;</b> 'quotes' \"double\""),
                     msg("assistant", "Ünïcödé → ok ✓ <i>&lt;</i>"), msg("user", "日本語 and emoji 🎉")],
    "multi-line": [msg("user", "  first line\n  second line  \n\nthird line  "),
                   msg("assistant", "\n  An answer\n  on two lines.  \n"), msg("user", "  and again?  ")],
    "thinking": [msg("user", "What is 2 + 2?"),
                 msg("assistant", "<think>\nTwo and two.\n</think>\n\nIt is 4."), msg("user", "Thanks!")],
}

TOOL_CONVERSATIONS = {
    "tools": [SYSTEM, msg("user", "What is the weather in Paris?")],
    "tool-call": tool_call_turns("call_1", ARGUMENTS, "", msg("assistant", "It is 21 °C and sunny in Paris.")),
    "tool-call-null-content": tool_call_turns("call_1", ARGUMENTS, None, msg("user", "And tomorrow?")),
    "tool-call-string-args": tool_call_turns("call12345", json.dumps(ARGUMENTS), "",
                                             msg("assistant", "It is 21 °C and sunny.")),
}


# --- Cases ----------------------------------------------------------------------

def case(group, name, template, options, now, variables, expect_error=None):
    """The case jinja2 gives, or None where expect_error (peer cases) disagrees with it."""
    variables = json.loads(json.dumps(variables))  # render exactly what is recorded
    out, exc = render(template, options, now, variables)
    if expect_error is not None and expect_error != (exc is not None):
        return None
    c = {"group": group, "name": name, "template": template, "options": options, "now_unix": unix(now),
         "variables": variables}
    if exc is None:
        c["expected"] = out
    elif isinstance(exc, RaisedByTemplate):
        c["error"] = str(exc)
    else:
        c["error"] = ""
        c["note"] = f"{type(exc).__name__}: {exc}"
    return c


def uses_tools(meta, template):
    return meta["needs_tools"] or "tools" in template or "tool_calls" in template


def published_cases(folder):
    chat = {"trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": False}
    cases = []
    for meta in json.loads((folder / "templates.json").read_text(encoding="utf-8")):
        template = (folder / "templates" / f"{meta['name']}.jinja").read_text(encoding="utf-8")
        runs = [(name, messages, None, {}) for name, messages in CONVERSATIONS.items()]  # (.., tools, kwargs)
        if uses_tools(meta, template):
            runs += [(name, messages, TOOLS, {}) for name, messages in TOOL_CONVERSATIONS.items()]
        if "enable_thinking" in template:
            runs.append(("no-thinking", CONVERSATIONS["multi-turn"], None, {"enable_thinking": False}))
        # transformers passes the special tokens the tokenizer has (special_tokens_map leaves out unset ones)
        tokens = {k: meta[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if meta.get(k) is not None}
        for cname, messages, tools, kwargs in runs:
            for gen in (True, False):
                variables = {"messages": messages, "tools": TOOLS if meta["needs_tools"] else tools, "documents": None,
                             "add_generation_prompt": gen, **tokens, **kwargs}
                name = f"{meta['name']}/{cname}/{'gen' if gen else 'nogen'}"
                cases.append(case("published", name, template, chat, NOW, variables))
    return cases


def peer_cases(folder):
    peer = json.loads((folder / "peer.json").read_text(encoding="utf-8"))
    now = datetime.fromisoformat(peer["date_mock"].replace("Z", "+00:00")).astimezone(timezone.utc).replace(tzinfo=None)
    cases = []
    for c in peer["cases"]:
        options = {"trim_blocks": c["options"]["trim_blocks"], "lstrip_blocks": c["options"]["lstrip_blocks"],
                   "keep_trailing_newline": c["options"].get("keep_trailing_newline", False)}
        expected = c["expected"]
        ours = case("peer", f"{c['group']}/{c['name']}", c["template"], options, now, c["context"],
                    expect_error="error" in expected)
        if ours is not None and ("error" in ours or ours["expected"] == expected["output"]):
            cases.append(ours)
    print(f"peer.json: {len(peer['cases'])} cases, jinja2 passes {len(cases)}", file=sys.stderr)
    return cases


def cases_folder():
    if "LOOM_JINJA_CASES" in os.environ:
        return Path(os.environ["LOOM_JINJA_CASES"])
    return Path(__file__).resolve().parents[2].parent / "shared" / "jinja-cases"


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    os.makedirs(sys.argv[1], exist_ok=True)
    folder = cases_folder()
    out = {"jinja2": jinja2.__version__}
    if not (folder / "templates.json").is_file() or not (folder / "peer.json").is_file():
        out.update(missing=f"no jinja cases at {folder} (templates.json and peer.json; set LOOM_JINJA_CASES)",
                   cases=[])
    else:
        out["cases"] = published_cases(folder) + peer_cases(folder)
    with open(os.path.join(sys.argv[1], "jinja_cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    published = [c for c in out["cases"] if c["group"] == "published"]
    errors = sum("error" in c for c in published)
    print(f"jinja_cases.json: {len(published)} published cases ({errors} errors), "
          f"{len(out['cases']) - len(published)} peer cases, jinja2 {jinja2.__version__}"
          + (f" ({out['missing']})" if "missing" in out else ""))


if __name__ == "__main__":
    main()
