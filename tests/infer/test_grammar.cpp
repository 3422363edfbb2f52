// GBNF grammars: parsing (and its errors' line/column), the matcher's
// accept/can_end/can_continue (ambiguity, UTF-8 split across calls, invalid
// UTF-8), allowed_tokens against brute force, and its speed on 128k tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "infer/grammar.h"

using namespace loom::infer;

namespace {

GrammarMatcher matcher(const char* text) { return GrammarMatcher(parse_gbnf(text)); }

bool accepts_whole(const char* grammar, std::string_view s) {
  GrammarMatcher m = matcher(grammar);
  return m.accept(s) && m.can_end();
}

std::string error_of(const char* text) {
  try {
    parse_gbnf(text);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// JSON as llama.cpp's grammars/json.gbnf writes it (bounded whitespace).
constexpr const char* kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}  # bounded, as llama.cpp's
)";

}  // namespace

TEST(Gbnf, ErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("root ::= \"ab"), "grammar line 1, column 10: string literal is never closed");
  EXPECT_EQ(error_of("root ::= \"a\" |\n  foo"), "grammar line 2, column 3: undefined rule 'foo'");
  EXPECT_EQ(error_of("root ::= [b-a]"), "grammar line 1, column 11: range in a character class ends before it starts");
  EXPECT_EQ(error_of("root ::= a\na ::= a \"x\" | \"y\""),
            "grammar line 2, column 1: left recursion: rule 'a' can reach itself without matching a character");
  EXPECT_EQ(error_of("root ::= (\"a\"?)*").substr(0, 52), "grammar line 1, column 10: left recursion: this grou");
  EXPECT_EQ(error_of("root ::= \"a\" )"), "grammar line 1, column 14: ')' without a matching '('");
  EXPECT_EQ(error_of("x ::= \"a\""), "grammar line 1, column 1: no rule named 'root' (the start rule)");
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"), "grammar line 1, column 13: repetition {3,2} has max < min");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root ::= \"a\" b ::= \"c\""), "grammar line 1, column 14: rule 'b' starts before the previous rule ended");
  EXPECT_EQ(error_of("root ::= (\"a\"\n"), "grammar line 1, column 10: '(' is never closed");
  EXPECT_EQ(error_of("root ::= [a-"), "grammar line 1, column 10: character class is never closed");
  EXPECT_EQ(error_of("root ::= \"\\u12\""), "grammar line 1, column 15: expected 4 hex digits in the escape");
}

TEST(Gbnf, LiteralsClassesEscapesAndComments) {
  const char* g = "root ::= \"\\x41\\u00e9\\U0001F600\" [\\]\\-] | # comment\n   \"\\\"\" .";
  EXPECT_TRUE(accepts_whole(g, "Aé😀]"));
  EXPECT_TRUE(accepts_whole(g, "Aé😀-"));
  EXPECT_TRUE(accepts_whole(g, "\"日"));
  EXPECT_FALSE(accepts_whole(g, "Aé😀a"));
  EXPECT_TRUE(accepts_whole(kJson, "{\"a\": [1, -2.5e3, \"x\\n\\u00e9\", true, null, {}]}"));
  EXPECT_FALSE(accepts_whole(kJson, "{\"a\": 01}"));
  EXPECT_FALSE(accepts_whole(kJson, "{\"a\": 1,}"));
}

TEST(Gbnf, RepetitionCounts) {
  const char* g = "root ::= \"a\"{2,4} \"b\"{3} \"c\"{1,}";
  EXPECT_TRUE(accepts_whole(g, "aabbbc"));
  EXPECT_TRUE(accepts_whole(g, "aaaabbbccc"));
  EXPECT_FALSE(accepts_whole(g, "abbbc"));
  EXPECT_FALSE(accepts_whole(g, "aaaaabbbc"));
  EXPECT_FALSE(accepts_whole(g, "aabbc"));
  EXPECT_FALSE(accepts_whole(g, "aabbb"));
  // A repeated item that can be empty: 2^30 ways to split, one state.
  EXPECT_TRUE(accepts_whole("root ::= (\"a\"?){0,30} \"b\"", "aaaab"));
  EXPECT_FALSE(accepts_whole("root ::= (\"a\"?){0,3} \"b\"", "aaaab"));
}

TEST(GrammarMatcher, CanEndAndCanContinue) {
  GrammarMatcher m = matcher("root ::= \"a\" \"b\"?");
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.can_continue());
  ASSERT_TRUE(m.accept("a"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.can_continue());
  ASSERT_TRUE(m.accept("b"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.can_continue());
  EXPECT_FALSE(m.accept("b"));
}

TEST(GrammarMatcher, AcceptIsAllOrNothing) {
  GrammarMatcher m = matcher("root ::= [a-c]+ \"!\"");
  EXPECT_FALSE(m.accept("abz"));
  ASSERT_TRUE(m.accept("ab"));
  EXPECT_FALSE(m.accept("c!!"));
  ASSERT_TRUE(m.accept("c!"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, AmbiguousAlternativesStayAlive) {
  const char* g = "root ::= x | y | z\nx ::= \"a\"+ \"b\"\ny ::= \"a\"* \"c\"\nz ::= (\"a\" | \"a\" \"a\")* \"d\"";
  for (const char* s : {"aaab", "aaac", "c", "aaaaad", "d"}) EXPECT_TRUE(accepts_whole(g, s)) << s;
  EXPECT_FALSE(accepts_whole(g, "b"));
  GrammarMatcher m = matcher(g);
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(m.accept("a"));  // stacks dedupe: no blow-up
  EXPECT_TRUE(m.accept("d"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, ClassesMatchCodePointsSplitAcrossCalls) {
  GrammarMatcher m = matcher(R"(root ::= "\"" [^"\\]* "\"")");
  ASSERT_TRUE(m.accept("\"a"));
  const std::string s = "日😀é";  // 3 + 4 + 2 bytes, fed one byte at a time
  for (char c : s) ASSERT_TRUE(m.accept(std::string(1, c)));
  EXPECT_FALSE(m.can_end());
  GrammarMatcher mid = m;
  ASSERT_TRUE(mid.accept("\xE6"));  // a character begun: no end, no quote yet
  EXPECT_FALSE(mid.can_end());
  EXPECT_FALSE(mid.accept("\""));
  ASSERT_TRUE(m.accept("\""));
  EXPECT_TRUE(m.can_end());
  // A partial character no class can complete is refused at its first byte.
  GrammarMatcher ascii = matcher("root ::= [a-z]*");
  EXPECT_FALSE(ascii.accept("\xE6"));
  EXPECT_FALSE(matcher("root ::= [\\u0100-\\u01FF]").accept("\xC3"));  // U+00C0..U+00FF only
  EXPECT_TRUE(matcher("root ::= [\\u0100-\\u01FF]").accept("\xC4"));
  // E0 and F0 alone carry no bits yet: the characters they begin are past
  // U+07FF and U+FFFF, so an ASCII-only grammar refuses them too.
  for (const char* lead : {"\xE0", "\xF0", "\xC2", "\xE1", "\xF1"}) {
    EXPECT_FALSE(matcher(R"(root ::= "yes" | "<tool_call>" | [a-z\x7f])").accept(lead)) << "lead byte " << lead;
    EXPECT_FALSE(matcher("root ::= [\\u0080-\\u07FF]").accept(lead) && std::string(lead) != "\xC2") << lead;
  }
  EXPECT_TRUE(matcher("root ::= [\\u0800-\\u0FFF]").accept("\xE0"));
  EXPECT_TRUE(matcher("root ::= [\\U00010000-\\U0003FFFF]").accept("\xF0"));
}

TEST(GrammarMatcher, InvalidUtf8IsNeverAccepted) {
  const char* any = "root ::= .*";
  for (const char* bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5", "\x80",
                          "\xFF", "\xE6\x97", "\xE6\x41"}) {
    GrammarMatcher m = matcher(any);
    EXPECT_FALSE(m.accept(bad) && m.can_end()) << "bytes " << bad;
  }
  EXPECT_TRUE(accepts_whole(any, "\xF4\x8F\xBF\xBF\xED\x9F\xBF\xE0\xA0\x80"));  // U+10FFFF, U+D7FF, U+0800
}

namespace {

// A random vocabulary with the bytes the grammars care about, multibyte
// characters, their pieces, and bytes that are never valid UTF-8.
std::vector<std::string> random_vocab(size_t n, uint32_t seed) {
  const std::vector<std::string> atoms = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\t", "\\", "a", "b", "c", "x",
                                          "0", "1", "5", "9", "-", "+", ".", "e", "E", "u", "n", "t", "r", "f", "l",
                                          "s", "true", "null", "é", "日", "😀", "\xE6", "\x97\xA5", "\xF0\x9F", "\x98",
                                          "\x80", "\xFF", "\xC0", "(", ")", "*", "/"};
  std::mt19937 rng(seed);
  std::vector<std::string> vocab = {""};  // an empty token is never allowed
  for (const std::string& a : atoms) vocab.push_back(a);
  while (vocab.size() < n) {
    std::string t;
    for (size_t k = 1 + rng() % 5; k > 0; --k) t += atoms[rng() % atoms.size()];
    vocab.push_back(t);
  }
  return vocab;
}

void expect_mask_is_brute_force(const GrammarMatcher& m, const std::vector<std::string>& vocab, const TokenTrie& trie,
                                std::vector<uint8_t>& mask) {
  allowed_tokens(m, trie, mask);
  ASSERT_EQ(mask.size(), vocab.size());
  for (size_t t = 0; t < vocab.size(); ++t) {
    GrammarMatcher copy = m;
    const bool ok = !vocab[t].empty() && copy.accept(vocab[t]);
    ASSERT_EQ(mask[t], ok ? 1 : 0) << "token " << t << " '" << vocab[t] << "'";
  }
}

}  // namespace

TEST(AllowedTokens, EqualsBruteForceOnRandomWalks) {
  const std::vector<std::string> vocab = random_vocab(3000, 7);
  const TokenTrie trie(vocab);
  ASSERT_EQ(trie.size(), 3000);
  const char* grammars[] = {
      kJson,
      "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\" | \"-\" term",
      "root ::= \"\\\"\" [^\"\\\\\\u0080-\\u00FF]* \"\\\"\" | [日-日]+ \"😀\"?",
      "root ::= (a | b)* \"}\"\na ::= \"ab\" | \"a\" \"b\" | [a-c]\nb ::= \"é\" \"é\"? | \"\\n\"{1,3}",
  };
  std::mt19937 rng(11);
  std::vector<uint8_t> mask;
  for (const char* text : grammars) {
    const auto g = parse_gbnf(text);
    for (int walk = 0; walk < 4; ++walk) {
      GrammarMatcher m(g);
      for (int step = 0; step < 12; ++step) {
        expect_mask_is_brute_force(m, vocab, trie, mask);
        std::vector<size_t> allowed;
        for (size_t t = 0; t < mask.size(); ++t)
          if (mask[t]) allowed.push_back(t);
        if (allowed.empty()) break;
        ASSERT_TRUE(m.accept(vocab[allowed[rng() % allowed.size()]]));
      }
    }
  }
}

// Not an assertion: prints ms per mask on a 128k-token vocabulary of
// realistic token lengths (DESIGN.md §1.8: speed is measured, not asserted).
TEST(AllowedTokens, TimingOn128kTokens) {
  std::mt19937 rng(3);
  const std::string chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 ,.:;\"{}[]_-\n\\'/()";
  std::vector<std::string> vocab;
  std::geometric_distribution<int> len(0.2);
  while (vocab.size() < 128000) {
    std::string t = rng() % 3 ? " " : "";
    for (int k = 1 + len(rng); k > 0; --k) {
      const uint32_t r = rng() % 20;
      t += r == 0 ? "日" : r == 1 ? "é" : std::string(1, chars[rng() % chars.size()]);
    }
    vocab.push_back(t.substr(0, 16));
  }
  const TokenTrie trie(vocab);
  const auto g = parse_gbnf(kJson);
  const std::pair<const char*, const char*> states[] = {
      {"inside a JSON string", "{\"name\": \"abc"}, {"just after {", "{"}, {"inside a number", "{\"n\": [12"}};
  std::vector<uint8_t> mask;
  for (const auto& [what, prefix] : states) {
    GrammarMatcher m(g);
    ASSERT_TRUE(m.accept(prefix));
    constexpr int kReps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kReps; ++i) allowed_tokens(m, trie, mask);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kReps;
    size_t n = 0;
    for (uint8_t v : mask) n += v;
    std::printf("allowed_tokens %-22s %7.3f ms per mask (%zu of %zu tokens allowed)\n", what, ms, n, vocab.size());
  }
}
