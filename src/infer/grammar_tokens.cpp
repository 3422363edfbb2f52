// The token mask: the vocabulary's byte trie walked once in preorder, each
// node's state the byte transition of its parent's. Transitions are
// memoised in a lazy DFA over (stacks, partial character) built for the
// call: inside a JSON string a character leads back to the same hash-consed
// stacks, so nearly every trie node is one table look-up.
#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "core/error.h"
#include "infer/grammar.h"

namespace loom::infer {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes) : n_tokens_(int32_t(token_bytes.size())) {
  std::vector<int32_t> order;
  for (size_t t = 0; t < token_bytes.size(); ++t) {
    LOOM_REQUIRE(token_bytes[t].size() <= 65535, "token ", t, " is ", token_bytes[t].size(), " bytes: at most 65535");
    if (!token_bytes[t].empty()) order.push_back(int32_t(t));
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return token_bytes[size_t(a)] < token_bytes[size_t(b)]; });
  byte_ = {0};
  depth_ = {0};
  subtree_end_ = {0};
  std::vector<uint32_t> path = {0};  // path[d]: the node at depth d on the current branch
  std::vector<uint32_t> token_node;
  std::string_view prev;
  for (int32_t t : order) {
    const std::string& s = token_bytes[size_t(t)];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    for (; path.size() - 1 > common; path.pop_back()) subtree_end_[path.back()] = uint32_t(byte_.size());
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(s[d]));
      depth_.push_back(uint16_t(d + 1));
      subtree_end_.push_back(0);
    }
    tokens_.push_back(t);
    token_node.push_back(path.back());
    prev = s;
  }
  for (uint32_t n : path) subtree_end_[n] = uint32_t(byte_.size());
  token_begin_.assign(byte_.size() + 1, 0);
  for (uint32_t n : token_node) ++token_begin_[n + 1];
  std::partial_sum(token_begin_.begin(), token_begin_.end(), token_begin_.begin());
}

namespace {

using grammar_detail::StackArena;
using grammar_detail::Utf8Partial;

constexpr int32_t kUnknown = -2, kDead = -1;

// States (stacks, partial character) and their byte transitions, made on
// first use. A state without a partial character has 256 transitions; one
// with has 64 (continuation bytes 80..BF; any other byte is dead).
class LazyDfa {
 public:
  LazyDfa(const Grammar& g, const StackArena& arena) : g_(g), arena_(arena) {}

  int32_t add(std::span<const int32_t> stacks, const Utf8Partial& p) {
    std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size_bytes());
    key.append(reinterpret_cast<const char*>(&p.cp), sizeof p.cp);
    key.push_back(char(p.need));
    key.push_back(char(p.lo));
    key.push_back(char(p.hi));
    auto [it, added] = index_.emplace(std::move(key), int32_t(states_.size()));
    if (!added) return it->second;
    states_.push_back({uint32_t(pool_.size()), uint32_t(stacks.size()), p, uint32_t(trans_.size())});
    pool_.insert(pool_.end(), stacks.begin(), stacks.end());
    trans_.resize(trans_.size() + (p.need ? 64 : 256), kUnknown);
    return it->second;
  }

  int32_t next(int32_t s, uint8_t b) {
    const State& st = states_[size_t(s)];
    size_t slot = b;
    if (st.p.need) {
      if (b < 0x80 || b > 0xBF) return kDead;
      slot = b - 0x80;
    }
    const int32_t t = trans_[st.trans + slot];
    return t != kUnknown ? t : compute(s, slot, b);
  }

 private:
  struct State {
    uint32_t begin, len;
    Utf8Partial p;
    uint32_t trans;
  };

  int32_t compute(int32_t s, size_t slot, uint8_t b) {
    const State st = states_[size_t(s)];
    cur_.assign(pool_.begin() + st.begin, pool_.begin() + st.begin + st.len);
    Utf8Partial np;
    const int32_t t = grammar_detail::step_byte(g_, arena_, cur_, st.p, b, out_, np, seen_) ? add(out_, np) : kDead;
    trans_[st.trans + slot] = t;
    return t;
  }

  const Grammar& g_;
  StackArena arena_;  // a copy: transitions intern new nodes
  grammar_detail::VisitSet seen_;
  std::vector<State> states_;
  std::vector<int32_t> pool_, trans_, cur_, out_;
  std::unordered_map<std::string, int32_t> index_;
};

}  // namespace

void allowed_tokens(const GrammarMatcher& m, const TokenTrie& trie, std::vector<uint8_t>& mask) {
  mask.assign(size_t(trie.size()), 0);
  if (m.stacks_.empty()) return;
  LazyDfa dfa(*m.g_, m.arena_);
  std::vector<int32_t> at_depth(1, dfa.add(m.stacks_, m.partial_));
  const size_t n_nodes = trie.byte_.size();
  for (size_t n = 1; n < n_nodes;) {
    const size_t d = trie.depth_[n];
    const int32_t s = dfa.next(at_depth[d - 1], trie.byte_[n]);
    if (s == kDead) {
      n = trie.subtree_end_[n];
      continue;
    }
    if (at_depth.size() <= d) at_depth.resize(d + 1);
    at_depth[d] = s;
    for (uint32_t k = trie.token_begin_[n]; k < trie.token_begin_[n + 1]; ++k) mask[size_t(trie.tokens_[k])] = 1;
    ++n;
  }
}

}  // namespace loom::infer
