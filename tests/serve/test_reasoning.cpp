#include "serve/reasoning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/published_template.h"
#include "serve/store/chat_template.h"

namespace loom::serve {
namespace {

// with_last: the last piece is fed as the output's end (as a response's
// final delta is); else finish() follows the pieces.
ReasoningPiece split_pieces(bool inside, const std::vector<std::string>& pieces, bool with_last = false,
                            ThinkTags tags = {}) {
  ReasoningSplit s(inside, tags);
  ReasoningPiece all;
  for (size_t i = 0; i < pieces.size(); ++i) {
    ReasoningPiece r = s.feed(pieces[i], with_last && i + 1 == pieces.size());
    all.reasoning += r.reasoning, all.content += r.content;
  }
  ReasoningPiece r = s.finish();
  all.reasoning += r.reasoning, all.content += r.content;
  return all;
}

// The split of text fed whole, and fed in two pieces cut at every byte and
// one byte at a time, are all the same: a stream gives what a body gives.
void expect_split(bool inside, const std::string& text, const std::string& reasoning, const std::string& content,
                  ThinkTags tags = {}) {
  SCOPED_TRACE(text);
  const ReasoningPiece whole = split_pieces(inside, {text}, false, tags);
  EXPECT_EQ(whole.reasoning, reasoning);
  EXPECT_EQ(whole.content, content);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    for (const bool with_last : {false, true}) {
      const ReasoningPiece two = split_pieces(inside, {text.substr(0, cut), text.substr(cut)}, with_last, tags);
      EXPECT_EQ(two.reasoning, reasoning) << "cut at " << cut << (with_last ? ", the end fed with the text" : "");
      EXPECT_EQ(two.content, content) << "cut at " << cut << (with_last ? ", the end fed with the text" : "");
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const ReasoningPiece each = split_pieces(inside, bytes, false, tags);
  EXPECT_EQ(each.reasoning, reasoning);
  EXPECT_EQ(each.content, content);
}

TEST(ReasoningSplit, AModelThatWritesBothTagsAsQwen3) {
  expect_split(false, "<think>\nLet me see.\n\nTwo steps.\n</think>\n\nThe answer is 4.", "Let me see.\n\nTwo steps.",
               "The answer is 4.");
}

TEST(ReasoningSplit, APromptThatOpenedTheBlockAsDeepSeekR1) {
  expect_split(true, "\nfirst, x = 2\n</think>\n\nx is 2", "first, x = 2", "x is 2");
}

TEST(ReasoningSplit, OutputWithoutAThinkBlockIsAllContentUntouched) {
  expect_split(false, "  Hello <think> there", "", "  Hello <think> there");
  expect_split(false, "<thin", "", "<thin");
  expect_split(false, "   ", "", "   ");
  expect_split(false, "", "", "");
}

TEST(ReasoningSplit, AnOutputThatEndsWhileThinkingIsAllReasoning) {
  expect_split(true, "still thinking about <the> </thi", "still thinking about <the> </thi", "");
  expect_split(false, "<think> only this  \n", "only this", "");
}

TEST(ReasoningSplit, TagsAfterTheBlockAreContent) {
  expect_split(false, "<think>a</think>b <think>c</think>", "a", "b <think>c</think>");
  expect_split(true, "</think>answer", "", "answer");
}

TEST(ReasoningSplit, WhitespaceInsideTheReasoningIsKept) {
  expect_split(true, "a  \n b\t</think> c ", "a  \n b", "c ");
}

TEST(ReasoningSplit, APromptOpensTheBlockWhenItEndsWithTheTag) {
  EXPECT_TRUE(prompt_opens_think("<|Assistant|><think>\n"));
  EXPECT_TRUE(prompt_opens_think("<think>"));
  EXPECT_FALSE(prompt_opens_think("<think>done</think>\n<|assistant|>"));
  EXPECT_FALSE(prompt_opens_think("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_think(""));
}

using test::published_template;

TEST(ReasoningSplit, CommandR7bsThinkingTags) {
  const ThinkTags r7b = kCommandR7bThinkTags;
  expect_split(false, "<|START_THINKING|>I will add.<|END_THINKING|>It is 4.", "I will add.", "It is 4.", r7b);
  expect_split(false, "<think>not R7B's</think>", "", "<think>not R7B's</think>", r7b);
  EXPECT_TRUE(prompt_opens_think("<|CHATBOT_TOKEN|><|START_THINKING|>", r7b));
  EXPECT_FALSE(prompt_opens_think("<|START_THINKING|><|END_THINKING|>", r7b));
}

// Command R7B's published template thinks only when enable_thinking is true;
// unset or false, it closes an empty block in the prompt.
TEST(ReasoningSplit, CommandR7bsTemplateThinksWithItsOwnTags) {
  ChatTemplate t;
  t.source = published_template("command-r7b-tool-use");
  if (t.source.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  EXPECT_TRUE(template_thinks(t.source));
  const ThinkTags tags = think_tags_of(t.source);
  EXPECT_EQ(tags.open, kCommandR7bThinkTags.open);
  EXPECT_EQ(tags.close, kCommandR7bThinkTags.close);
  const ChatRenderer render = chat_renderer(t);
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hi"}}};
  const std::string thinking = render(messages, nullptr, true, {{"enable_thinking", true}});
  const std::string closed = render(messages, nullptr, true, nullptr);
  EXPECT_TRUE(thinking.ends_with("<|CHATBOT_TOKEN|>")) << thinking;
  EXPECT_TRUE(closed.ends_with("<|START_THINKING|><|END_THINKING|>")) << closed;
  expect_split(prompt_opens_think(thinking, tags), "<|START_THINKING|>plan<|END_THINKING|>Hello!", "plan", "Hello!",
               tags);
  expect_split(prompt_opens_think(closed, tags), "Hello!", "", "Hello!", tags);
  EXPECT_EQ(think_tags_of(published_template("qwen3")).open, "<think>");
}

// Qwen3's published template (read from ../shared/jinja-cases): unset,
// enable_thinking leaves the block to the model; false closes an empty one
// in the prompt, so the answer that follows is content from its first byte.
TEST(ReasoningSplit, Qwen3sEnableThinkingReachesItsTemplate) {
  ChatTemplate t;
  t.source = published_template("qwen3");
  if (t.source.empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  const ChatRenderer render = chat_renderer(t);
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "Hi"}}};
  const std::string open = render(messages, nullptr, true, nullptr);
  const std::string closed = render(messages, nullptr, true, {{"enable_thinking", false}});
  EXPECT_TRUE(open.ends_with("<|im_start|>assistant\n")) << open;
  EXPECT_TRUE(closed.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << closed;
  EXPECT_FALSE(prompt_opens_think(open));
  EXPECT_FALSE(prompt_opens_think(closed));
  expect_split(prompt_opens_think(open), "<think>\nhmm\n</think>\n\nHello!", "hmm", "Hello!");
  expect_split(prompt_opens_think(closed), "Hello!", "", "Hello!");
}

}  // namespace
}  // namespace loom::serve
