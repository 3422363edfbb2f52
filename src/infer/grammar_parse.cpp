// GBNF text -> Grammar: a recursive-descent parser over the text, groups and
// repetitions lowered to helper rules (x* is R ::= x R | "" — right
// recursion, which the recognizer runs in constant stack depth; x{m,n} is m
// copies of x then n-m nested optional rules, unambiguous), then checks:
// every referenced rule defined, no left recursion.
#include <algorithm>
#include <map>

#include "core/error.h"
#include "infer/grammar.h"

namespace loom::infer {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 100000;  // {m,n} bounds: beyond this a grammar is a mistake, not a language

struct Sym {
  Grammar::Kind kind;
  uint32_t arg;
};
using Seq = std::vector<Sym>;

struct RuleDraft {
  std::string name;
  std::vector<Seq> alts;
  bool defined = false;
  size_t where = 0;  // offset of its definition (or first reference / the group it lowers)
};

}  // namespace

// Builds a Grammar while the text is parsed; owns the error positions.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : text_(text) {}
  std::shared_ptr<const Grammar> parse(std::string_view root);

 private:
  [[noreturn]] void fail_at(size_t at, const std::string& what) const;
  void skip_space(bool newline_ok);
  std::string parse_name();
  uint32_t parse_char(bool in_class);  // one (possibly escaped) character at pos_
  uint32_t hex_escape(int digits);
  std::vector<Seq> parse_alternatives(bool nested);
  Seq parse_sequence(bool nested);
  Seq parse_element();
  Seq parse_literal();
  Seq parse_class();
  void parse_repetition(Seq& seq, Seq item, size_t at);
  uint32_t rule_ref(const std::string& name, size_t at);
  uint32_t new_rule(std::vector<Seq> alts, size_t at);
  uint32_t class_id(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated);
  void check_left_recursion() const;
  std::shared_ptr<const Grammar> finish(uint32_t root);

  std::string_view text_;
  size_t pos_ = 0;
  std::vector<RuleDraft> rules_;
  std::map<std::string, uint32_t, std::less<>> by_name_;
  std::vector<CharClass> classes_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> class_ids_;
};

void GrammarBuilder::fail_at(size_t at, const std::string& what) const {
  int line = 1, col = 1;
  for (size_t i = 0; i < at && i < text_.size(); ++i) {
    if (text_[i] == '\n') ++line, col = 1;
    else ++col;
  }
  fail("grammar line ", line, ", column ", col, ": ", what);
}

void GrammarBuilder::skip_space(bool newline_ok) {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
      ++pos_;
    } else if (c == '#') {
      while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
    } else {
      break;
    }
  }
}

static bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

std::string GrammarBuilder::parse_name() {
  const size_t start = pos_;
  while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
  if (pos_ == start) fail_at(start, "expected a rule name (letters, digits, '-', '_')");
  return std::string(text_.substr(start, pos_ - start));
}

uint32_t GrammarBuilder::hex_escape(int digits) {
  uint32_t v = 0;
  for (int i = 0; i < digits; ++i, ++pos_) {
    const char c = pos_ < text_.size() ? text_[pos_] : '\0';
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) fail_at(pos_, concat("expected ", digits, " hex digits in the escape"));
    v = v * 16 + uint32_t(d);
  }
  if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail_at(pos_ - size_t(digits), "escape is not a Unicode scalar value");
  return v;
}

// One character of a literal or class: an escape or a UTF-8 sequence.
uint32_t GrammarBuilder::parse_char(bool in_class) {
  const auto b = static_cast<unsigned char>(text_[pos_]);
  if (b == '\\') {
    if (++pos_ >= text_.size()) fail_at(pos_, "unfinished escape");
    const char e = text_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return uint32_t(e);
      case 'x': return hex_escape(2);
      case 'u': return hex_escape(4);
      case 'U': return hex_escape(8);
      default: fail_at(pos_ - 2, concat("unknown escape '\\", e, "'", in_class ? " in a class" : ""));
    }
  }
  const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (len == 0 || pos_ + size_t(len) > text_.size()) fail_at(pos_, "invalid UTF-8 in the grammar text");
  uint32_t cp = len == 1 ? b : b & (0xFF >> (len + 1));
  for (int i = 1; i < len; ++i) {
    const auto c = static_cast<unsigned char>(text_[pos_ + size_t(i)]);
    if ((c >> 6) != 2) fail_at(pos_, "invalid UTF-8 in the grammar text");
    cp = (cp << 6) | (c & 0x3F);
  }
  pos_ += size_t(len);
  return cp;
}

uint32_t GrammarBuilder::class_id(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> comp;
    uint32_t next = 0;
    for (const auto& r : merged) {
      if (r.first > next) comp.emplace_back(next, r.first - 1);
      next = r.second + 1;
    }
    if (next <= kMaxCodePoint) comp.emplace_back(next, kMaxCodePoint);
    merged = std::move(comp);
  }
  auto [it, added] = class_ids_.emplace(merged, uint32_t(classes_.size()));
  if (added) {
    CharClass c;
    c.ranges = merged;
    for (const auto& r : merged)
      for (uint32_t cp = r.first; cp <= std::min<uint32_t>(r.second, 127); ++cp) c.ascii[cp / 64] |= uint64_t(1) << (cp % 64);
    classes_.push_back(std::move(c));
  }
  return it->second;
}

uint32_t GrammarBuilder::rule_ref(const std::string& name, size_t at) {
  auto [it, added] = by_name_.emplace(name, uint32_t(rules_.size()));
  if (added) rules_.push_back(RuleDraft{name, {}, false, at});
  return it->second;
}

uint32_t GrammarBuilder::new_rule(std::vector<Seq> alts, size_t at) {
  rules_.push_back(RuleDraft{"", std::move(alts), true, at});  // unnamed: a group or a repetition
  return uint32_t(rules_.size() - 1);
}

std::vector<Seq> GrammarBuilder::parse_alternatives(bool nested) {
  std::vector<Seq> alts;
  alts.push_back(parse_sequence(nested));
  while (pos_ < text_.size() && text_[pos_] == '|') {
    ++pos_;
    skip_space(true);
    alts.push_back(parse_sequence(nested));
  }
  return alts;
}

Seq GrammarBuilder::parse_sequence(bool nested) {
  Seq seq;
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c == '|' || c == ')' || c == '\n') break;
    const size_t at = pos_;
    Seq item = parse_element();
    skip_space(nested);
    parse_repetition(seq, std::move(item), at);
    skip_space(nested);
  }
  return seq;
}

Seq GrammarBuilder::parse_element() {
  const char c = text_[pos_];
  if (c == '"') return parse_literal();
  if (c == '[') return parse_class();
  if (c == '.') {
    ++pos_;
    return {Sym{Grammar::Kind::cls, class_id({{0, kMaxCodePoint}}, false)}};
  }
  if (c == '(') {
    const size_t at = pos_++;
    skip_space(true);
    std::vector<Seq> alts = parse_alternatives(true);
    if (pos_ >= text_.size() || text_[pos_] != ')') fail_at(at, "'(' is never closed");
    ++pos_;
    if (alts.size() == 1) return alts[0];
    return {Sym{Grammar::Kind::ref, new_rule(std::move(alts), at)}};
  }
  if (is_name_char(c)) {
    const size_t at = pos_;
    const std::string name = parse_name();
    size_t after = pos_;
    while (after < text_.size() && (text_[after] == ' ' || text_[after] == '\t')) ++after;
    if (text_.substr(after, 3) == "::=") fail_at(at, concat("rule '", name, "' starts before the previous rule ended"));
    return {Sym{Grammar::Kind::ref, rule_ref(name, at)}};
  }
  fail_at(pos_, concat("unexpected '", c, "'"));
}

Seq GrammarBuilder::parse_literal() {
  const size_t at = pos_++;
  Seq seq;
  while (true) {
    if (pos_ >= text_.size() || text_[pos_] == '\n') fail_at(at, "string literal is never closed");
    if (text_[pos_] == '"') break;
    const uint32_t cp = parse_char(false);
    seq.push_back(Sym{Grammar::Kind::cls, class_id({{cp, cp}}, false)});
  }
  ++pos_;
  return seq;
}

Seq GrammarBuilder::parse_class() {
  const size_t at = pos_++;
  const bool negated = pos_ < text_.size() && text_[pos_] == '^';
  if (negated) ++pos_;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  while (true) {
    if (pos_ >= text_.size() || text_[pos_] == '\n') fail_at(at, "character class is never closed");
    if (text_[pos_] == ']') break;
    const size_t first_at = pos_;
    const uint32_t lo = parse_char(true);
    uint32_t hi = lo;
    if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
      ++pos_;
      hi = parse_char(true);
      if (hi < lo) fail_at(first_at, "range in a character class ends before it starts");
    }
    ranges.emplace_back(lo, hi);
  }
  ++pos_;
  return {Sym{Grammar::Kind::cls, class_id(std::move(ranges), negated)}};
}

// Appends item with its repetition (if one follows at pos_) to seq.
void GrammarBuilder::parse_repetition(Seq& seq, Seq item, size_t at) {
  int lo = 1, hi = 1;  // hi -1: unbounded
  const char c = pos_ < text_.size() ? text_[pos_] : '\0';
  if (c == '*' || c == '+' || c == '?') {
    ++pos_;
    lo = c == '+' ? 1 : 0;
    hi = c == '?' ? 1 : -1;
  } else if (c == '{') {
    const size_t brace = pos_++;
    auto number = [&]() {
      skip_space(false);
      const size_t start = pos_;
      long v = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9' && v <= kMaxRepeat) v = v * 10 + (text_[pos_++] - '0');
      if (pos_ == start) fail_at(start, "expected a number in {m,n}");
      if (v > kMaxRepeat) fail_at(start, concat("repetition count over ", kMaxRepeat));
      skip_space(false);
      return int(v);
    };
    lo = hi = number();
    if (pos_ < text_.size() && text_[pos_] == ',') {
      ++pos_;
      skip_space(false);
      hi = pos_ < text_.size() && text_[pos_] == '}' ? -1 : number();
    }
    if (pos_ >= text_.size() || text_[pos_] != '}') fail_at(brace, "'{' of a repetition is never closed");
    ++pos_;
    if (hi >= 0 && hi < lo) fail_at(brace, concat("repetition {", lo, ",", hi, "} has max < min"));
  } else {
    seq.insert(seq.end(), item.begin(), item.end());
    return;
  }
  // One symbol to copy: a multi-symbol (or empty) item becomes a rule.
  const Sym x = item.size() == 1 ? item[0] : Sym{Grammar::Kind::ref, new_rule({item}, at)};
  for (int i = 0; i < lo; ++i) seq.push_back(x);
  if (hi < 0) {
    const uint32_t star = new_rule({}, at);
    rules_[star].alts = {Seq{x, Sym{Grammar::Kind::ref, star}}, Seq{}};
    seq.push_back(Sym{Grammar::Kind::ref, star});
  } else if (hi > lo) {
    uint32_t opt = new_rule({Seq{x}, Seq{}}, at);
    for (int k = 1; k < hi - lo; ++k) opt = new_rule({Seq{x, Sym{Grammar::Kind::ref, opt}}, Seq{}}, at);
    seq.push_back(Sym{Grammar::Kind::ref, opt});
  }
}

std::shared_ptr<const Grammar> GrammarBuilder::parse(std::string_view root) {
  skip_space(true);
  while (pos_ < text_.size()) {
    const size_t at = pos_;
    const std::string name = parse_name();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") fail_at(pos_, concat("expected '::=' after rule name '", name, "'"));
    pos_ += 3;
    skip_space(true);
    const uint32_t r = rule_ref(name, at);
    if (rules_[r].defined) fail_at(at, concat("rule '", name, "' is defined twice"));
    std::vector<Seq> alts = parse_alternatives(false);
    rules_[r].alts = std::move(alts);
    rules_[r].defined = true;
    rules_[r].where = at;
    if (pos_ < text_.size() && text_[pos_] == ')') fail_at(pos_, "')' without a matching '('");
    skip_space(true);
  }
  for (const RuleDraft& r : rules_)
    if (!r.defined) fail_at(r.where, concat("undefined rule '", r.name, "'"));
  const auto it = by_name_.find(root);
  if (it == by_name_.end()) fail_at(0, concat("no rule named '", root, "' (the start rule)"));
  check_left_recursion();
  return finish(it->second);
}

// A rule that reaches itself through a prefix that can match empty text
// would make the recognizer expand forever: refused, naming the rule.
void GrammarBuilder::check_left_recursion() const {
  const size_t n = rules_.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& alt : rules_[r].alts) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Sym& s) {
          return s.kind == Grammar::Kind::ref && nullable[s.arg];
        });
        if (all) nullable[r] = 1, changed = true;
        if (all) break;
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(n);  // rules reachable as a leftmost symbol (after nullable ones)
  for (size_t r = 0; r < n; ++r)
    for (const Seq& alt : rules_[r].alts)
      for (const Sym& s : alt) {
        if (s.kind != Grammar::Kind::ref) break;
        left[r].push_back(s.arg);
        if (!nullable[s.arg]) break;
      }
  std::vector<char> state(n, 0);  // 0 new, 1 on the DFS path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (uint32_t start = 0; start < n; ++start) {
    if (state[start]) continue;
    stack.push_back({start, 0});
    state[start] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i == left[r].size()) {
        state[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t next = left[r][i++];
      if (state[next] == 1) {
        const RuleDraft& d = rules_[next];
        fail_at(d.where, d.name.empty() ? "left recursion: this group or repetition can repeat without matching a "
                                          "character (a repetition of something that can be empty?)"
                                        : concat("left recursion: rule '", d.name,
                                                 "' can reach itself without matching a character"));
      }
      if (state[next] == 0) state[next] = 1, stack.push_back({next, 0});
    }
  }
}

std::shared_ptr<const Grammar> GrammarBuilder::finish(uint32_t root) {
  auto g = std::make_shared<Grammar>();
  g->rule_alts_.push_back(0);
  for (const RuleDraft& r : rules_) {
    for (const Seq& alt : r.alts) {
      g->alt_starts_.push_back(uint32_t(g->symbols_.size()));
      for (const Sym& s : alt) g->symbols_.push_back(Grammar::make(s.kind, s.arg));
      g->symbols_.push_back(Grammar::make(Grammar::Kind::end, 0));
    }
    g->rule_alts_.push_back(uint32_t(g->alt_starts_.size()));
  }
  g->classes_ = std::move(classes_);
  g->root_ = root;
  return g;
}

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root) {
  return GrammarBuilder(text).parse(root);
}

}  // namespace loom::infer
