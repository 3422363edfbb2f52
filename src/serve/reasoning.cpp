#include "serve/reasoning.h"

namespace loom::serve {
namespace {

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t leading_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && space(s[i])) ++i;
  return i;
}

size_t trailing_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && space(s[s.size() - 1 - n])) ++n;
  return n;
}

// The length of the longest end of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

bool template_thinks(std::string_view source) {
  return source.find("<think>") != std::string_view::npos || source.find("enable_thinking") != std::string_view::npos ||
         source.find(kCommandR7bThinkTags.open) != std::string_view::npos ||
         source.find("<|channel|>analysis") != std::string_view::npos;  // harmony's analysis channel (harmony.h)
}

ThinkTags think_tags_of(std::string_view source) {
  return source.find(kCommandR7bThinkTags.open) != std::string_view::npos ? kCommandR7bThinkTags : ThinkTags{};
}

ReasoningSplit::ReasoningSplit(bool inside, ThinkTags tags)
    : state_(inside ? State::reasoning : State::start), tags_(tags) {}

ReasoningPiece ReasoningSplit::feed(std::string_view text, bool last) {
  held_ += text;
  return drain(last);
}

ReasoningPiece ReasoningSplit::drain(bool last) {
  const std::string_view kOpen = tags_.open, kClose = tags_.close;
  ReasoningPiece out;
  if (state_ == State::start) {
    const std::string_view rest = std::string_view(held_).substr(leading_space(held_));
    if (rest.substr(0, kOpen.size()) == kOpen) {
      held_.erase(0, held_.size() - rest.size() + kOpen.size());
      state_ = State::reasoning;
    } else if (!last && kOpen.substr(0, rest.size()) == rest) {
      return out;  // only whitespace, or the start of the open tag, so far
    } else {
      state_ = State::content;  // no think block: the text is all answer, untouched
      out.content = std::move(held_);
      held_.clear();
      return out;
    }
  }
  if (state_ == State::reasoning) {
    const size_t close = held_.find(kClose);
    const bool ends = close != std::string::npos || last;
    std::string_view part = std::string_view(held_).substr(0, close == std::string::npos ? held_.size() : close);
    if (!reasoning_started_) part.remove_prefix(leading_space(part));
    // Held back: a possible start of the close tag, and whitespace that may be the reasoning's last.
    const size_t keep = ends ? 0 : partial_tag(part, kClose);
    part.remove_suffix(keep);
    const size_t tail = trailing_space(part);
    part.remove_suffix(tail);
    out.reasoning = std::string(part);
    if (!part.empty()) reasoning_started_ = true;
    if (close == std::string::npos) {  // still thinking (or the output ended inside the block)
      held_.erase(0, last ? held_.size() : held_.size() - keep - tail);
      return out;
    }
    held_.erase(0, close + kClose.size());
    held_.erase(0, leading_space(held_));  // the answer starts at its first visible character
    state_ = held_.empty() && !last ? State::reasoning_done : State::content;
    if (state_ == State::reasoning_done) return out;
  }
  if (state_ == State::reasoning_done) {
    held_.erase(0, leading_space(held_));
    if (held_.empty()) return out;
    state_ = State::content;
  }
  out.content += held_;
  held_.clear();
  return out;
}

bool prompt_opens_think(std::string_view prompt, ThinkTags tags) {
  const std::string_view kOpen = tags.open;
  prompt.remove_suffix(trailing_space(prompt));
  return prompt.size() >= kOpen.size() && prompt.substr(prompt.size() - kOpen.size()) == kOpen;
}

}  // namespace loom::serve
