#!/usr/bin/env python3
"""The size budget of STYLE.md habit 4: files under ~500 lines, functions
under ~60, in src/ and bench/ (*.h, *.cpp, and the CUDA sources *.cu, *.cuh).

    check_sizes.py [ROOT]     ROOT: the repository (default: this script's ..)

What is counted, precisely:
  * A file's size is its number of lines (as `wc -l`, plus a last line
    without a newline).
  * A function's size is the number of lines from the line of the `{` that
    opens its body to the line of the `}` that closes it, both included
    (blank and comment lines count; a one-line function is 1). The lines of
    a multi-line signature do not count.
  * Functions are found by a brace-matching heuristic, not a C++ parser:
    after comments, string and character literals and preprocessor lines are
    blanked out, a `{` at namespace or class scope (top level, inside
    `namespace`/`extern "C"`, or inside a class/struct/union body) opens a
    function body when the declaration before it has a `(` outside any
    brackets and no `=` outside brackets (an `=` means an initializer). A
    constructor's member initializers (`: a_(x), b_{y}`) are skipped. So
    free functions, out-of-class member definitions (`Foo::bar`) and member
    functions defined in a class body are counted; a lambda or local class
    counts towards the function it is written in; a namespace-scope lambda
    assigned to a variable is not counted on its own.
  * A function is named as written before its parameter list (`Foo::bar`,
    `operator()`); overloads of one name in one file are one entry, the
    longest counts.

Exceptions live in check_sizes.allow next to this script, one a line:
    PATH[:FUNCTION]  LIMIT  REASON
LIMIT is the size allowed instead of the default; REASON says why, in a few
words. The check fails (exit 1), naming each offender, when
  * a file or function is over its limit (the default, or its entry's), or
  * an entry is no longer needed: its file or function is gone or back
    within the default limit. Failing (not just warning) keeps the list
    short: an entry is removed in the change that makes it unnecessary.
"""

import re
import sys
from pathlib import Path

FILE_LIMIT = 500
FUNCTION_LIMIT = 60
FOLDERS = ("src", "bench")
SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
ALLOW_FILE = Path(__file__).with_name("check_sizes.allow")


def blank_out(text):
    """text with comments, string/char literals (raw strings included) and
    preprocessor lines replaced by spaces; newlines are kept, so line numbers
    stay right."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # A preprocessor line, with its backslash continuations.
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|::|->|[^\s\w]")


def tokens(text):
    """(text, line) of each token of blanked-out C++."""
    result = []
    for number, line in enumerate(text.split("\n"), start=1):
        for m in TOKEN.finditer(line):
            result.append((m.group(0), number))
    return result


OPEN = {"(": ")", "[": "]", "{": "}"}


def skip_group(toks, i):
    """Index just past the bracket group opening at toks[i]."""
    depth = 0
    while i < len(toks):
        t = toks[i][0]
        if t in OPEN:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def strip_template_heads(decl):
    """decl without leading `template <...>` heads (their `=` are defaults)."""
    while len(decl) >= 2 and decl[0][0] == "template" and decl[1][0] == "<":
        depth, k = 0, 1
        while k < len(decl):
            if decl[k][0] == "<":
                depth += 1
            elif decl[k][0] == ">":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        decl = decl[k + 1:]
    return decl


def top_level(decl):
    """(index, token) of each token of decl at bracket depth 0; an opening
    bracket at depth 0 is included, what it encloses is not."""
    depth = 0
    for k, (t, _) in enumerate(decl):
        if t in OPEN:
            if depth == 0:
                yield k, t
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
        elif depth == 0:
            yield k, t


def function_name(decl):
    """The name written before the parameter list of a function declaration
    (`bar`, `Foo::bar`, `~Foo`, `operator()`), or None."""
    k = next((k for k, t in top_level(decl) if t == "("), None)
    if k is None:
        return None
    words = [t for t, _ in decl]
    if k >= 1 and words[k - 1] == "operator" and k + 1 < len(words) and words[k + 1] == ")":
        name, j = ["operator()"], k - 2  # operator()(...): the parameters come second
    else:
        at = next((j for j in range(k - 1, max(-1, k - 5), -1) if words[j] == "operator"), None)
        if at is not None:
            name, j = ["operator" + (" " if re.match(r"\w", words[at + 1]) else "") + "".join(words[at + 1:k])], at - 1
        elif k >= 1 and re.match(r"[A-Za-z_]", words[k - 1]):
            name, j = [words[k - 1]], k - 2
            if j >= 0 and words[j] == "~":
                name, j = ["~" + name[0]], j - 1
        else:
            return None
    # Qualifiers: Foo::bar, ns::Foo<T>::bar (template arguments dropped).
    while j >= 1 and words[j] == "::":
        j -= 1
        if words[j] == ">":
            angle = 0
            while j >= 0:
                angle += {">": 1, "<": -1}.get(words[j], 0)
                if angle == 0:
                    break
                j -= 1
            j -= 1
        if j < 0 or not re.match(r"[A-Za-z_]", words[j]):
            break
        name = [words[j], "::"] + name
        j -= 1
    return "".join(name)


def initializer_brace(head):
    """True when the `{` after head belongs to a constructor's member
    initializer (`Foo() : a_{x} {`), not to the body."""
    close = None
    for k, t in top_level(head):
        if t == "(":
            close = skip_group(head, k) - 1
            break
    if close is None:
        return False
    rest = [t for t, _ in head[close + 1:]]
    if ":" not in rest or not rest:
        return False
    return bool(re.match(r"[A-Za-z_]\w*$", rest[-1])) or rest[-1] == ">"


def functions(text):
    """(name, line of the opening brace, size in lines) of each function
    body, as described in this file's header."""
    # CUDA's __launch_bounds__(...) sits between a kernel's return type and
    # its name: blanked (lines kept), so the kernel is named by its name.
    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    toks = tokens(blank_out(text))
    found = []
    decl = []  # the declaration read so far at the current namespace/class scope
    i = 0
    while i < len(toks):
        t, line = toks[i]
        if t in (";", "}"):  # a declaration ends, or a namespace/class body does
            decl = []
            i += 1
        elif t in ("(", "["):
            end = skip_group(toks, i)
            decl.extend(toks[i:end])
            i = end
        elif t != "{":
            decl.append(toks[i])
            i += 1
        else:
            head = strip_template_heads(decl)
            words = [w for w, _ in head]
            at_top = [w for _, w in top_level(head)]
            has_paren = "(" in at_top
            has_assign = any(w == "=" and "operator" not in at_top[max(0, k - 3):k] for k, w in enumerate(at_top))
            if not words or words[0] in ("namespace", "extern") or words[:2] == ["inline", "namespace"] or (
                    any(w in ("class", "struct", "union") for w in words) and not has_paren):
                decl = []  # a namespace or class body: its declarations are read in turn
                i += 1
            elif "enum" in words or has_assign or not has_paren or initializer_brace(head):
                # An enum body, an initializer, a braced variable or a member
                # initializer: part of the declaration, skipped whole.
                end = skip_group(toks, i)
                decl.extend(toks[i:end])
                i = end
            else:
                end = skip_group(toks, i)
                name = function_name(head)
                if name is not None:
                    found.append((name, line, toks[end - 1][1] - line + 1))
                decl = []
                i = end
    return found


def file_lines(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def read_allow_list(path):
    entries = {}
    problems = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[1].isdigit():
            problems.append(f"{path.name}:{number}: expected 'PATH[:FUNCTION] LIMIT REASON', got: {raw}")
            continue
        entries[parts[0]] = (int(parts[1]), number)
    return entries, problems


def main():
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    allow, problems = read_allow_list(ALLOW_FILE)
    measured = {}  # key -> (size, default limit, where)
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            text = path.read_text(errors="replace")
            measured[rel] = (file_lines(text), FILE_LIMIT, rel)
            for name, line, size in functions(text):
                key = f"{rel}:{name}"
                if key not in measured or size > measured[key][0]:
                    measured[key] = (size, FUNCTION_LIMIT, f"{rel}:{line}")
    checked = 0
    for key, (size, default, where) in sorted(measured.items()):
        checked += 1
        kind = "function" if ":" in key else "file"
        if key in allow:
            limit, number = allow[key]
            if size > limit:
                problems.append(f"{where}: {kind} {key} is {size} lines, over its allowance of {limit} "
                                f"({ALLOW_FILE.name}:{number})")
            elif size <= default:
                problems.append(f"{ALLOW_FILE.name}:{number}: {key} is {size} lines, within the default "
                                f"{default}: remove its entry")
        elif size > default:
            problems.append(f"{where}: {kind} {key} is {size} lines, over the limit of {default} lines "
                            f"(split it, or add a justified entry to scripts/{ALLOW_FILE.name})")
    for key, (limit, number) in sorted(allow.items()):
        if key not in measured:
            problems.append(f"{ALLOW_FILE.name}:{number}: {key} does not exist any more: remove its entry")
    for p in problems:
        print(p)
    print(f"check_sizes: {checked} files and functions in {', '.join(FOLDERS)}; {len(allow)} allowed exceptions; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
