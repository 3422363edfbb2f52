// loom::serve::jinja against the real jinja2: every case of
// tests/ref/ref_chat_template.py (published Hugging Face chat templates on
// several conversations, and small templates per feature, rendered by
// Debian's python3-jinja2) must render to the same string, or fail with an
// error containing the recorded substring. Then what jinja2 cannot check:
// errors name line and column, deep nesting is an error and not a stack
// overflow, and random mutations of real templates only ever throw
// loom::Error.
#include <chrono>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/jinja/jinja.h"

namespace loom::serve::jinja {
namespace {

using json = nlohmann::json;

const json& ref_cases() {
  static const json cases = [] {
    const std::string path = std::string(LOOM_REF_DIR) + "/chat_template_cases.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("missing " + path + ": run the ref_chat_template fixture");
    return json::parse(in)["cases"];
  }();
  return cases;
}

Options options_of(const json& c) {
  const json& o = c["options"];
  return {.trim_blocks = o["trim_blocks"].get<bool>(),
          .lstrip_blocks = o["lstrip_blocks"].get<bool>(),
          .keep_trailing_newline = o["keep_trailing_newline"].get<bool>()};
}

// Renders every case of group; returns how many there were.
int check_group(const std::string& group) {
  int n = 0;
  for (const json& c : ref_cases()) {
    if (c["group"] != group) continue;
    ++n;
    SCOPED_TRACE(c["name"].get<std::string>());
    std::string out, error;
    try {
      out = Template::parse(c["template"].get<std::string>(), options_of(c)).render(c["variables"]);
    } catch (const loom::Error& e) {
      error = e.what();
    }
    if (c.contains("expected")) {
      EXPECT_EQ(error, "");
      EXPECT_EQ(out, c["expected"].get<std::string>());
    } else {
      EXPECT_NE(error.find(c["error"].get<std::string>()), std::string::npos)
          << "error: " << error << "\nwanted: " << c["error"] << "\noutput: " << out;
    }
  }
  return n;
}

std::string error_of(std::string_view source, const json& variables = json::object()) {
  try {
    Template::parse(source).render(variables);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(Jinja, PublishedChatTemplatesRenderAsJinja2Does) { EXPECT_GT(check_group("published"), 300); }

TEST(Jinja, FeatureTemplatesRenderAsJinja2Does) { EXPECT_GT(check_group("features"), 70); }

TEST(Jinja, OptionsDefaultToTransformersEnvironment) {
  const Options o;
  EXPECT_TRUE(o.trim_blocks);
  EXPECT_TRUE(o.lstrip_blocks);
  EXPECT_FALSE(o.keep_trailing_newline);
  const std::string source = "<p>\n  {% if true %}\n  x\n  {% endif %}\n</p>\n";
  EXPECT_EQ(Template::parse(source).render(json::object()), "<p>\n  x\n</p>");
  EXPECT_EQ(Template::parse(source, {.trim_blocks = false, .lstrip_blocks = false}).render(json::object()),
            "<p>\n  \n  x\n  \n</p>");
  EXPECT_EQ(Template::parse(source, {.trim_blocks = true, .lstrip_blocks = false}).render(json::object()),
            "<p>\n    x\n  </p>");
  EXPECT_EQ(Template::parse(source, {.trim_blocks = false, .lstrip_blocks = true}).render(json::object()),
            "<p>\n\n  x\n\n</p>");
  EXPECT_EQ(Template::parse("a\n", {.keep_trailing_newline = true}).render(json::object()), "a\n");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Hello\n{{ 1 + }}", "jinja:2:8: expected an expression"},
      {"{% if x %}\n{% endfor %}", "jinja:2:4: unexpected 'endfor'"},
      {"{% if x %}\nopen", "jinja:2:5: the template ended inside 'if' (line 1:4): expected 'endif'"},
      {"{{ x | nope }}", "jinja:1:8: unknown filter 'nope'"},
      {"{{ x is nope }}", "jinja:1:9: unknown test 'nope'"},
      {"a\n  {% frobnicate %}", "jinja:2:6: unknown tag 'frobnicate'"},
      {"{% include 'x' %}", "jinja:1:4: the 'include' tag is not supported"},
      {"{{ 'abc }}", "jinja:1:4: the string is not closed"},
      {"x\n{# never closed", "jinja:2:1: the comment is not closed"},
      {"{{ (1 }}", "jinja:1:7: unexpected '}', expected ')'"},
      {"{{ a b }}", "jinja:1:6: expected '}}', got 'b'"},
      {"{% for %}", "jinja:1:8: expected a name"},
      {"{% set x %}", "jinja:1:12: the template ended inside 'set'"},
      {"{% break %}", "jinja:1:4: 'break' outside a for loop"},
      {"{{ 1, 2 }}", "jinja:1:5: tuples are not supported"},
      {"{{ 99999999999999999999 }}", "jinja:1:4: the integer 99999999999999999999 is past"},
      {"{{ x", "jinja:1:1: '}}' is missing"},
      {"{{ '\\x4' }}", "jinja:1:4: truncated \\x escape"},
      {"{{ a ` b }}", "jinja:1:6: unexpected character '`'"},
  };
  for (const auto& [source, expected] : cases) {
    SCOPED_TRACE(source);
    EXPECT_THROW(Template::parse(source), loom::Error);
    EXPECT_NE(error_of(source).find(expected), std::string::npos) << error_of(source);
  }
}

TEST(Jinja, RenderErrorsNameTheLine) {
  EXPECT_NE(error_of("line one\n{{ 1 / 0 }}").find("jinja:2:6: division by zero"), std::string::npos);
  EXPECT_NE(error_of("\n\n  {{ raise_exception('roles must alternate') }}").find("jinja:3:"), std::string::npos);
  EXPECT_NE(error_of("{{ raise_exception('roles must alternate') }}").find("roles must alternate"), std::string::npos);
  EXPECT_NE(error_of("{% for a, b in [1] %}{% endfor %}").find("jinja:1:4: cannot unpack"), std::string::npos);
  EXPECT_NE(error_of("{{ x }}", json::array()).find("must be a JSON object"), std::string::npos);
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  const std::vector<std::string> sources = {
      "{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}",
      "{{ " + repeat("[", 100000) + " }}",
      "{{ " + repeat("not ", 100000) + "x }}",
      "{{ " + repeat("-", 100000) + "1 }}",
      "{{ 1" + repeat(" + 1", 100000) + " }}",
      "{{ x" + repeat("|trim", 100000) + " }}",
      "{{ x" + repeat(".a", 100000) + " }}",
      "{{ x" + repeat("()", 100000) + " }}",
      "{{ 1" + repeat(" if x else 1", 100000) + " }}",
      repeat("{% if x %}", 100000),
      repeat("{% for x in y %}", 100000),
  };
  for (const std::string& source : sources) {
    SCOPED_TRACE(source.substr(0, 40));
    EXPECT_NE(error_of(source).find("deeper than 256"), std::string::npos) << error_of(source).substr(0, 200);
  }
  // Deep data: from the caller, or built by a loop.
  // (Parsed in place: copying a json this deep would overflow the stack.)
  const json deep = json::parse("{\"x\": " + repeat("[", 100000) + repeat("]", 100000) + "}");
  EXPECT_NE(error_of("{{ x }}", deep).find("nest deeper than 512"), std::string::npos);
  const std::string builder =
      "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}";
  EXPECT_NE(error_of(builder).find("at most 512 levels deep"), std::string::npos);
}

// A macro kept in a list is a marker in the list's data that only the render
// which made it can read back (its random nonce): a request's JSON shaped
// like one stays data.
TEST(Jinja, ClientDataShapedLikeAMacroMarkerStaysData) {
  const std::string k = "\x01" "callable", n = "\x01" "nonce";
  for (uint64_t nonce : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    const json variables = {{"xs", json::array({json{{k, 0}, {n, nonce}}})}};
    EXPECT_EQ(Template::parse("{% macro m() %}m{% endmacro %}{% set ys = [m] %}{{ xs[0] is mapping }}").render(variables),
              "True");
    EXPECT_NE(error_of("{% macro m() %}{% endmacro %}{% set ys = [m] %}{{ xs[0]() }}", variables).find("not callable"),
              std::string::npos);
  }
}

// jinja2's caller is a closure that outlives its call block; loom's runs in
// the block's scope while the macro it called runs, and past that is an
// error (not a crash: a Modelfile's TEMPLATE comes from clients).
TEST(Jinja, CallerKeptPastItsCallBlockIsAnError) {
  EXPECT_NE(error_of("{% macro keep() %}{% set ns.c = caller %}{% endmacro %}{% set ns = namespace(c=none) %}"
                     "{% call keep() %}x{% endcall %}{{ ns.c() }}")
                .find("caller() called outside its call block"),
            std::string::npos);
}

// jinja2's ints have no bound; loom's stop at 64 bits, with an error rather
// than a wrong number.
TEST(Jinja, IntFilterPast64BitsIsAnErrorNotZero) {
  for (const char* source : {"{{ '99999999999999999999' | int }}", "{{ '-9223372036854775809' | int }}",
                             "{{ 1e22 | int }}", "{{ '1e22' | int }}", "{{ -9.3e18 | int }}"}) {
    SCOPED_TRACE(source);
    EXPECT_NE(error_of(source).find("past loom's 64-bit integers"), std::string::npos) << error_of(source);
  }
}

// transformers formats a naive datetime.now(): %z and %Z are empty.
TEST(Jinja, StrftimeNowHasNoTimeZone) {
  const Options at{.now_unix = 1752148800};  // 2025-07-10 12:00:00 UTC
  EXPECT_EQ(Template::parse("{{ strftime_now('%H:%M%z%Z|%%z|%%%Z|%f') }}", at).render(json::object()),
            "12:00|%z|%|000000");
}

// A str method loom lacks is named as such, whatever its arguments.
TEST(Jinja, MissingStrMethodsAreNamed) {
  EXPECT_NE(error_of("{{ 'abc'.find('c') }}").find("no str method 'find'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc'.zfill(5) }}").find("no str method 'zfill'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a b'.rsplit(' ', maxsplit=1) }}").find("no str method 'rsplit'"), std::string::npos);
  EXPECT_NE(error_of("{{ '{:>4}'.format(1) }}").find("fields other than"), std::string::npos);
}

TEST(Jinja, RunawayTemplatesStopWithAnError) {
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                .find("more than 1000000 loop iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}")
                .find("over 67108864"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 9223372036854775807 }}").find("over 67108864"), std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}" + repeat("text ", 200) + "{% endfor %}")
                .find("the output is over 67108864 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(error_of("{{ '' * 9223372036854775807 }}"), "(no error)");
}

// Byte flips, truncations, deletions and insertions of template syntax into
// the published templates: parse and render either succeed or throw
// loom::Error, never anything else, never a crash or a hang.
TEST(Jinja, RandomMutationsOfRealTemplatesOnlyThrowLoomError) {
  std::vector<std::pair<std::string, json>> seeds;  // (template, variables)
  std::set<std::string> seen;
  for (const json& c : ref_cases()) {
    const std::string t = c["template"].get<std::string>();
    if (c["group"] == "published" && seen.insert(t).second) seeds.emplace_back(t, c["variables"]);
  }
  ASSERT_GE(seeds.size(), 10u);
  const std::vector<std::string> pieces = {"{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "(", ")", "[", "]",
                                           "{", "}", "'", "\"", "|", ".", ",", "not ", " if ", " else ", "endfor",
                                           "endif", "\\", "\n", " is ", "~", "**", "loop", "ns.", "=", ":"};
  std::mt19937 rng(20240531);
  const auto below = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const auto start = std::chrono::steady_clock::now();
  int rendered = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const auto& [seed, variables] = seeds[below(seeds.size())];
    std::string t = seed;
    for (size_t m = 0, n = 1 + below(3); m < n; ++m) {
      const size_t at = below(t.size() + 1);
      switch (below(5)) {
        case 0: if (at < t.size()) t[at] = static_cast<char>(rng() & 0xFF); break;
        case 1: t.resize(at); break;
        case 2: t.insert(at, pieces[below(pieces.size())]); break;
        case 3: t.erase(at, below(16)); break;
        default: t.insert(at, t.substr(below(t.size()), below(64))); break;
      }
    }
    try {
      Template::parse(t).render(variables);
      ++rendered;
    } catch (const loom::Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a loom::Error (" << e.what() << ") for mutation " << iter << ":\n" << t;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("mutations: %d rendered, %d refused with loom::Error, %.2f s\n", rendered, refused, seconds);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace loom::serve::jinja
