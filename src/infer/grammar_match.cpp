// The recognizer: hash-consed stacks, the closure that expands rule
// references until every stack's top is a character class, the UTF-8 byte
// step, and GrammarMatcher over them.
#include <algorithm>

#include "core/error.h"
#include "infer/grammar.h"

namespace loom::infer {

bool CharClass::matches(uint32_t cp) const {
  if (cp < 128) return (ascii[cp / 64] >> (cp % 64)) & 1;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp, [](uint32_t v, const auto& r) { return v < r.first; });
  return it != ranges.begin() && cp <= std::prev(it)->second;
}

bool CharClass::intersects(uint32_t lo, uint32_t hi) const {
  for (const auto& r : ranges)
    if (r.first <= hi && lo <= r.second) return true;
  return false;
}

namespace grammar_detail {

static uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int32_t StackArena::intern(uint32_t pos, int32_t parent) {
  if (table.size() < 2 * (nodes.size() + 1)) {
    std::vector<int32_t> bigger(std::max<size_t>(64, table.size() * 2), -1);
    const size_t m = bigger.size() - 1;
    for (size_t id = 0; id < nodes.size(); ++id) {
      size_t h = mix((uint64_t(nodes[id].pos) << 32) | uint32_t(nodes[id].parent)) & m;
      while (bigger[h] >= 0) h = (h + 1) & m;
      bigger[h] = int32_t(id);
    }
    table = std::move(bigger);
  }
  const size_t m = table.size() - 1;
  size_t h = mix((uint64_t(pos) << 32) | uint32_t(parent)) & m;
  for (; table[h] >= 0; h = (h + 1) & m)
    if (nodes[size_t(table[h])].pos == pos && nodes[size_t(table[h])].parent == parent) return table[h];
  table[h] = int32_t(nodes.size());
  nodes.push_back({pos, parent});
  return table[h];
}

void VisitSet::clear() {
  if (used) std::fill(slots.begin(), slots.end(), -1);
  used = 0;
}

bool VisitSet::insert(int64_t key) {
  if (slots.size() < 2 * (used + 1)) {
    std::vector<int64_t> old = std::move(slots);
    slots.assign(std::max<size_t>(64, old.size() * 2), -1);
    used = 0;
    for (int64_t k : old)
      if (k >= 0) insert(k);
  }
  const size_t m = slots.size() - 1;
  for (size_t h = mix(uint64_t(key)) & m;; h = (h + 1) & m) {
    if (slots[h] == key) return false;
    if (slots[h] < 0) {
      slots[h] = key;
      ++used;
      return true;
    }
  }
}

namespace {

// The stacks reached from frame (pos, parent) without matching a character:
// references expand into their alternatives (a return address is kept only
// when something follows the reference: tail calls keep right recursion
// flat), ends pop to the parent frame, classes are tops.
void closure(const Grammar& g, StackArena& arena, uint32_t pos, int32_t parent, std::vector<int32_t>& out,
             VisitSet& seen) {
  if (!seen.insert((int64_t(pos) << 32) | uint32_t(parent + 1))) return;
  const uint32_t sym = g.symbol(pos);
  switch (Grammar::kind(sym)) {
    case Grammar::Kind::end:
      if (parent == kComplete) {
        out.push_back(kComplete);
      } else {
        const StackArena::Node p = arena.nodes[size_t(parent)];
        closure(g, arena, p.pos, p.parent, out, seen);
      }
      return;
    case Grammar::Kind::cls:
      if (!g.char_class(Grammar::arg(sym)).ranges.empty()) out.push_back(arena.intern(pos, parent));
      return;
    case Grammar::Kind::ref: {
      const bool tail = Grammar::kind(g.symbol(pos + 1)) == Grammar::Kind::end;
      const int32_t frame = tail ? parent : arena.intern(pos + 1, parent);
      for (uint32_t alt : g.alternatives(Grammar::arg(sym))) closure(g, arena, alt, frame, out, seen);
      return;
    }
  }
}

void sort_unique(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Stacks whose top matches code point cp, each advanced past it.
void advance(const Grammar& g, StackArena& arena, std::span<const int32_t> stacks, uint32_t cp,
             std::vector<int32_t>& out, VisitSet& seen) {
  out.clear();
  seen.clear();
  for (int32_t s : stacks) {
    if (s == kComplete) continue;
    const StackArena::Node top = arena.nodes[size_t(s)];
    if (g.char_class(Grammar::arg(g.symbol(top.pos))).matches(cp)) closure(g, arena, top.pos + 1, top.parent, out, seen);
  }
  sort_unique(out);
}

// Stacks whose top could match some character that begins as p does.
void keep_viable(const Grammar& g, const StackArena& arena, std::span<const int32_t> stacks, const Utf8Partial& p,
                 std::vector<int32_t>& out) {
  const int shift = 6 * p.need;
  // The smallest code point still this long: after the lead bytes E0 and F0
  // alone the bits so far are 0, but the character is past 7FF / FFFF.
  const uint32_t floor = p.need == 3 ? 0x10000 : p.need == 2 ? 0x800 : 0x80;
  const uint32_t lo = std::max(p.cp << shift, floor), hi = (p.cp << shift) | ((uint32_t(1) << shift) - 1);
  out.clear();
  for (int32_t s : stacks)
    if (s != kComplete && g.char_class(Grammar::arg(g.symbol(arena.nodes[size_t(s)].pos))).intersects(lo, hi))
      out.push_back(s);
}

// A UTF-8 lead byte -> the partial character it opens (need 0: not a lead byte).
Utf8Partial lead(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {uint32_t(b & 0x1F), 1, 0x80, 0xBF};
  if (b >= 0xE0 && b <= 0xEF) return {uint32_t(b & 0x0F), 2, uint8_t(b == 0xE0 ? 0xA0 : 0x80), uint8_t(b == 0xED ? 0x9F : 0xBF)};
  if (b >= 0xF0 && b <= 0xF4) return {uint32_t(b & 0x07), 3, uint8_t(b == 0xF0 ? 0x90 : 0x80), uint8_t(b == 0xF4 ? 0x8F : 0xBF)};
  return {};
}

}  // namespace

bool step_byte(const Grammar& g, StackArena& arena, std::span<const int32_t> stacks, const Utf8Partial& partial,
               uint8_t byte, std::vector<int32_t>& out_stacks, Utf8Partial& out_partial, VisitSet& seen) {
  Utf8Partial next;
  if (partial.need == 0) {
    if (byte < 0x80) {
      advance(g, arena, stacks, byte, out_stacks, seen);
      out_partial = {};
      return !out_stacks.empty();
    }
    next = lead(byte);
    if (next.need == 0) return out_stacks.clear(), false;
  } else {
    if (byte < partial.lo || byte > partial.hi) return out_stacks.clear(), false;
    next = {(partial.cp << 6) | (byte & 0x3F), uint8_t(partial.need - 1), 0x80, 0xBF};
    if (next.need == 0) {
      advance(g, arena, stacks, next.cp, out_stacks, seen);
      out_partial = {};
      return !out_stacks.empty();
    }
  }
  keep_viable(g, arena, stacks, next, out_stacks);
  out_partial = next;
  return !out_stacks.empty();
}

void initial_stacks(const Grammar& g, StackArena& arena, std::vector<int32_t>& out, VisitSet& seen) {
  out.clear();
  seen.clear();
  for (uint32_t alt : g.alternatives(g.root())) closure(g, arena, alt, kComplete, out, seen);
  sort_unique(out);
}

}  // namespace grammar_detail

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  LOOM_CHECK(g_ != nullptr, "GrammarMatcher needs a grammar");
  grammar_detail::VisitSet seen;
  grammar_detail::initial_stacks(*g_, arena_, stacks_, seen);
  compacted_size_ = arena_.nodes.size();
}

bool GrammarMatcher::accept(std::string_view bytes) {
  if (bytes.empty()) return true;
  std::vector<int32_t> cur = stacks_, next;
  grammar_detail::Utf8Partial partial = partial_;
  grammar_detail::VisitSet seen;
  for (char c : bytes) {
    if (!grammar_detail::step_byte(*g_, arena_, cur, partial, uint8_t(c), next, partial, seen)) return false;
    cur.swap(next);
  }
  stacks_ = std::move(cur);
  partial_ = partial;
  if (arena_.nodes.size() > 2 * compacted_size_ + 256) compact();
  return true;
}

bool GrammarMatcher::can_end() const {
  return partial_.need == 0 && !stacks_.empty() && stacks_.front() == grammar_detail::kComplete;
}

bool GrammarMatcher::can_continue() const {
  return !stacks_.empty() && stacks_.back() != grammar_detail::kComplete;
}

// Rebuilds the arena with only the nodes the stacks reach. A parent is
// always interned before its children, so visiting ids in increasing order
// re-interns parents first and keeps the id order (stacks stay sorted).
void GrammarMatcher::compact() {
  std::vector<char> live(arena_.nodes.size(), 0);
  for (int32_t s : stacks_)
    for (int32_t n = s; n >= 0 && !live[size_t(n)]; n = arena_.nodes[size_t(n)].parent) live[size_t(n)] = 1;
  grammar_detail::StackArena fresh;
  std::vector<int32_t> remap(arena_.nodes.size(), -1);
  for (size_t id = 0; id < live.size(); ++id) {
    if (!live[id]) continue;
    const auto& n = arena_.nodes[id];
    remap[id] = fresh.intern(n.pos, n.parent < 0 ? n.parent : remap[size_t(n.parent)]);
  }
  for (int32_t& s : stacks_)
    if (s >= 0) s = remap[size_t(s)];
  arena_ = std::move(fresh);
  compacted_size_ = arena_.nodes.size();
}

}  // namespace loom::infer
