// Grammars for constrained decoding: GBNF text (llama.cpp's grammar syntax)
// parsed into an immutable Grammar, a GrammarMatcher that follows one
// sequence's output byte by byte, and allowed_tokens, the per-step mask of
// the vocabulary's tokens whose bytes may come next.
//
// Recognition is a nondeterministic pushdown recognizer, as llama.cpp's
// llama_grammar: the state is a set of stacks of grammar positions, every
// stack's top a character class. Stacks are hash-consed in an arena (a node
// is (position, parent), interned), so equal stacks are equal ids: dedupe is
// a sort, and after a character inside a JSON string the state is the same
// ids as before. allowed_tokens walks the vocabulary's byte trie once,
// memoising byte transitions between states (a lazy DFA built per call), so
// a mask costs about one table look-up per trie node that stays alive.
//
// Character classes match Unicode code points; the matcher decodes UTF-8
// (a token may end inside a character: the partial character is part of the
// state) and never accepts invalid UTF-8 (overlong forms, surrogates, past
// U+10FFFF).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::infer {

// A set of code points: sorted, disjoint, inclusive ranges (a negated class
// is stored complemented), plus a bitmap for ASCII, the common case.
struct CharClass {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::array<uint64_t, 2> ascii{};
  bool matches(uint32_t cp) const;
  bool intersects(uint32_t lo, uint32_t hi) const;  // some code point in [lo, hi] matches
};

// A grammar as flat symbol runs: each rule has alternatives, each
// alternative is a run of symbols in symbols() closed by an end symbol. A
// symbol is a character class or a reference to a rule. Immutable once built.
class Grammar {
 public:
  enum class Kind : uint32_t { end = 0, cls = 1, ref = 2 };
  static Kind kind(uint32_t sym) { return Kind(sym >> 30); }
  static uint32_t arg(uint32_t sym) { return sym & 0x3FFFFFFFu; }
  static uint32_t make(Kind k, uint32_t a) { return (uint32_t(k) << 30) | a; }

  uint32_t symbol(uint32_t pos) const { return symbols_[pos]; }
  std::span<const uint32_t> alternatives(uint32_t rule) const {  // start positions
    return {alt_starts_.data() + rule_alts_[rule], alt_starts_.data() + rule_alts_[rule + 1]};
  }
  const CharClass& char_class(uint32_t id) const { return classes_[id]; }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return rule_alts_.size() - 1; }

 private:
  friend class GrammarBuilder;
  std::vector<uint32_t> symbols_;
  std::vector<uint32_t> alt_starts_;
  std::vector<uint32_t> rule_alts_;  // rule r's alternatives: alt_starts_[rule_alts_[r] .. rule_alts_[r+1])
  std::vector<CharClass> classes_;
  uint32_t root_ = 0;
};

// GBNF text -> a grammar whose start rule is `root`. Syntax: `name ::=
// alternatives` (a rule ends at a newline, except after `::=`, after `|` and
// inside parentheses), literals "..." with \n \t \r \\ \" \[ \] \xHH \uHHHH
// \UHHHHHHHH escapes, classes [a-z] [^"\\], `.` (any character), groups
// ( ), repetitions * + ? {m} {m,} {m,n}, comments #, names [a-zA-Z0-9_-]+.
// loom::Error "grammar line L, column C: <what is wrong>" for bad text, an
// undefined rule, a rule defined twice, or left recursion (a rule that can
// reach itself without matching a character, e.g. a repetition of
// something that can be empty).
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root = "root");

namespace grammar_detail {

// Hash-consed stack nodes: node (pos, parent) is stored once; pos is the
// grammar position of the next symbol to match in that frame; parent -1 is
// the bottom. A stack is the id of its top node; kComplete is the empty
// stack (the input so far is a whole sentence).
inline constexpr int32_t kComplete = -1;
struct StackArena {
  struct Node {
    uint32_t pos;
    int32_t parent;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> table;  // open addressing over nodes; -1 empty; size a power of two
  int32_t intern(uint32_t pos, int32_t parent);
};

// A character begun but not finished: its bits so far, how many
// continuation bytes it still needs, and the range the next one must be in
// (narrower than 80..BF right after some lead bytes, which is how overlong
// forms, surrogates and code points past U+10FFFF are refused).
struct Utf8Partial {
  uint32_t cp = 0;
  uint8_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  bool operator==(const Utf8Partial&) const = default;
};

// The (position, parent) pairs one step has expanded: a pair expanded twice
// gives the same stacks, so the second time is skipped (without this, x{0,20}
// of an x that can be empty would expand 2^20 ways).
struct VisitSet {
  std::vector<int64_t> slots;  // open addressing; -1 empty
  size_t used = 0;
  void clear();
  bool insert(int64_t key);  // false: already there
};

// One byte of input: stacks (sorted, unique) and partial -> out_stacks and
// out_partial. Returns false (out_stacks empty) when no stack survives.
bool step_byte(const Grammar& g, StackArena& arena, std::span<const int32_t> stacks, const Utf8Partial& partial,
               uint8_t byte, std::vector<int32_t>& out_stacks, Utf8Partial& out_partial, VisitSet& seen);

// The stacks at the start of rule `root`.
void initial_stacks(const Grammar& g, StackArena& arena, std::vector<int32_t>& out, VisitSet& seen);

}  // namespace grammar_detail

// The state of one sequence's output against a grammar. Copying copies a
// small arena (compacted after each accept) and the stack ids.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);
  bool accept(std::string_view bytes);  // all or nothing: false leaves the state as it was
  bool can_end() const;                 // what was accepted is a whole sentence of the grammar
  bool can_continue() const;            // some byte may still follow

 private:
  friend void allowed_tokens(const GrammarMatcher& m, const class TokenTrie& trie, std::vector<uint8_t>& mask);
  void compact();
  std::shared_ptr<const Grammar> g_;
  grammar_detail::StackArena arena_;
  std::vector<int32_t> stacks_;  // sorted, unique; never empty
  grammar_detail::Utf8Partial partial_;
  size_t compacted_size_ = 0;  // arena nodes after the last compaction
};

// A vocabulary as a byte trie, nodes numbered in depth-first preorder so a
// subtree is the contiguous range [n, subtree_end[n]) and the mask walk is
// one forward loop that jumps over dead subtrees.
class TokenTrie {
 public:
  explicit TokenTrie(const std::vector<std::string>& token_bytes);  // index = token id
  int32_t size() const { return n_tokens_; }
  int64_t bytes() const {  // memory held
    return static_cast<int64_t>(byte_.capacity() + depth_.capacity() * 2 + (subtree_end_.capacity() +
                                token_begin_.capacity() + tokens_.capacity()) * 4);
  }

 private:
  friend void allowed_tokens(const GrammarMatcher& m, const TokenTrie& trie, std::vector<uint8_t>& mask);
  int32_t n_tokens_ = 0;
  std::vector<uint8_t> byte_;           // per node: the byte on the edge into it (root: unused)
  std::vector<uint16_t> depth_;         // per node; root 0
  std::vector<uint32_t> subtree_end_;   // per node
  std::vector<uint32_t> token_begin_;   // per node + 1: tokens ending at node n are tokens_[begin[n], begin[n+1])
  std::vector<int32_t> tokens_;
};

// mask resized to trie.size(); mask[t] = 1 where token t's bytes may follow
// m's input (m.accept(bytes) would return true), else 0. A token with empty
// bytes is never allowed.
void allowed_tokens(const GrammarMatcher& m, const TokenTrie& trie, std::vector<uint8_t>& mask);

}  // namespace loom::infer
