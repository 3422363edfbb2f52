// A thinking model's output split into its reasoning and its answer, as
// vLLM's reasoning parsers (deepseek_r1, qwen3) and ollama's `think` do:
// what stands between <think> and </think> is reasoning (OpenAI's
// `reasoning_content`, ollama's `message.thinking`), the rest is content.
// DeepSeek-R1's template opens the block in the prompt (the generation
// prompt ends with "<think>"), so the output starts inside it and only
// closes it; Qwen3's model writes both tags. Whitespace at the edges of the
// reasoning, and before the content that follows it, is dropped (ollama
// trims the same). A model that writes no think block gives content only.
//
// Command R7B writes its reasoning between <|START_THINKING|> and
// <|END_THINKING|> (ThinkTags: the template says which pair).
//
// Streamed: feed() returns the part of each piece that is certain; text that
// may be the start of a tag (or whitespace that may end the reasoning) is
// held back until the next piece or finish() decides.
#pragma once

#include <string>
#include <string_view>

namespace loom::serve {

// The tags a think block stands between.
struct ThinkTags {
  std::string_view open = "<think>", close = "</think>";
};
inline constexpr ThinkTags kCommandR7bThinkTags{"<|START_THINKING|>", "<|END_THINKING|>"};

// Whether a chat template has a thinking mode (it writes a think block's
// tags, reads enable_thinking, or has harmony's analysis channel), and which
// tags its model writes.
bool template_thinks(std::string_view template_source);
ThinkTags think_tags_of(std::string_view template_source);

struct ReasoningPiece {
  std::string reasoning;
  std::string content;
};

class ReasoningSplit {
 public:
  // inside: the prompt left a think block open (prompt_opens_think).
  explicit ReasoningSplit(bool inside, ThinkTags tags = {});
  // last: the output ends with text, and everything held back comes out (a
  // tag never completed is text of the part it is in).
  ReasoningPiece feed(std::string_view text, bool last = false);
  ReasoningPiece finish() { return feed({}, true); }

 private:
  // start: nothing visible yet; reasoning_done: after </think>, before the
  // answer's first visible character.
  enum class State { start, reasoning, reasoning_done, content };
  ReasoningPiece drain(bool last);

  State state_;
  ThinkTags tags_;
  bool reasoning_started_ = false;  // the reasoning's leading whitespace is behind
  std::string held_;
};

// True when a rendered prompt ends inside an open think block: it ends with
// the open tag and maybe whitespace (DeepSeek-R1's generation prompt).
bool prompt_opens_think(std::string_view prompt, ThinkTags tags = {});

}  // namespace loom::serve
