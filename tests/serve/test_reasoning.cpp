#include "serve/reasoning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "serve/store/chat_template.h"

namespace loom::serve {
namespace {

// with_last: the last piece is fed as the output's end (as a response's
// final delta is); else finish() follows the pieces.
ReasoningPiece split_pieces(bool inside, const std::vector<std::string>& pieces, bool with_last = false) {
  ReasoningSplit s(inside);
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
void expect_split(bool inside, const std::string& text, const std::string& reasoning, const std::string& content) {
  SCOPED_TRACE(text);
  const ReasoningPiece whole = split_pieces(inside, {text});
  EXPECT_EQ(whole.reasoning, reasoning);
  EXPECT_EQ(whole.content, content);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    for (const bool with_last : {false, true}) {
      const ReasoningPiece two = split_pieces(inside, {text.substr(0, cut), text.substr(cut)}, with_last);
      EXPECT_EQ(two.reasoning, reasoning) << "cut at " << cut << (with_last ? ", the end fed with the text" : "");
      EXPECT_EQ(two.content, content) << "cut at " << cut << (with_last ? ", the end fed with the text" : "");
    }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const ReasoningPiece each = split_pieces(inside, bytes);
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

// Qwen3's published template (read from ../shared/jinja-cases): unset,
// enable_thinking leaves the block to the model; false closes an empty one
// in the prompt, so the answer that follows is content from its first byte.
TEST(ReasoningSplit, Qwen3sEnableThinkingReachesItsTemplate) {
  const auto root = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
  std::ifstream in(root / "shared" / "jinja-cases" / "templates" / "qwen3.jinja");
  std::ostringstream source;
  source << in.rdbuf();
  if (source.str().empty()) GTEST_SKIP() << "../shared/jinja-cases is not here";
  ChatTemplate t;
  t.source = source.str();
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
