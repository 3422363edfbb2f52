// The stop rules: token-level (check_stop) and stop strings on streamed text.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "infer/request.h"
#include "infer/stop_strings.h"

namespace loom::infer {
namespace {

using loom::test::expect_error;

Request with_output(std::vector<int32_t> prompt, std::vector<int32_t> output, StopParams stop) {
  Request r;
  r.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  r.tokens = std::move(prompt);
  r.tokens.insert(r.tokens.end(), output.begin(), output.end());
  r.stop = std::move(stop);
  return r;
}

TEST(CheckStop, EosEndsWithStopUnlessIgnored) {
  StopParams s{.max_tokens = 10, .eos_token_ids = {50256}};
  EXPECT_EQ(check_stop(with_output({1, 2}, {7, 50256}, s), 100), FinishReason::stop);
  EXPECT_EQ(check_stop(with_output({1, 2}, {7, 8}, s), 100), FinishReason::none);
  s.ignore_eos = true;
  EXPECT_EQ(check_stop(with_output({1, 2}, {7, 50256}, s), 100), FinishReason::none);
}

TEST(CheckStop, StopTokenIdsEndWithStopEvenWhenEosIsIgnored) {
  const StopParams s{.max_tokens = 10, .ignore_eos = true, .stop_token_ids = {9, 11}};
  EXPECT_EQ(check_stop(with_output({1}, {11}, s), 100), FinishReason::stop);
  EXPECT_EQ(check_stop(with_output({1}, {10}, s), 100), FinishReason::none);
}

TEST(CheckStop, MinTokensHoldsBackEosAndStopTokens) {
  const StopParams s{.max_tokens = 10, .min_tokens = 3, .eos_token_ids = {0}, .stop_token_ids = {5}};
  EXPECT_EQ(check_stop(with_output({1}, {0}, s), 100), FinishReason::none);
  EXPECT_EQ(check_stop(with_output({1}, {2, 5}, s), 100), FinishReason::none);
  EXPECT_EQ(check_stop(with_output({1}, {2, 3, 5}, s), 100), FinishReason::stop);
}

TEST(CheckStop, MaxTokensAndContextLengthEndWithLength) {
  const StopParams s{.max_tokens = 3};
  EXPECT_EQ(check_stop(with_output({1}, {2, 3}, s), 100), FinishReason::none);
  EXPECT_EQ(check_stop(with_output({1}, {2, 3, 4}, s), 100), FinishReason::length);
  EXPECT_EQ(check_stop(with_output({1, 1, 1}, {2}, s), 4), FinishReason::length);
}

TEST(CheckStop, AStopTokenThatIsAlsoTheLastAllowedOneIsAStop) {
  const StopParams s{.max_tokens = 2, .eos_token_ids = {0}};
  EXPECT_EQ(check_stop(with_output({1}, {2, 0}, s), 100), FinishReason::stop);
}

TEST(StopParams, BadValuesAreClearErrors) {
  expect_error([] { StopParams{.max_tokens = 0}.validate(); }, {"max_tokens 0", "at least 1"});
  expect_error([] { StopParams{.max_tokens = 4, .min_tokens = 5}.validate(); }, {"min_tokens 5", "max_tokens (4)"});
  expect_error([] { StopParams{.stop_token_ids = {-3}}.validate(); }, {"stop token id -3"});
}

// Feeds pieces and returns everything emitted, with the flush at the end.
std::string run(StopStrings& s, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += s.feed(p).text;
  return out + s.flush();
}

TEST(StopStrings, TextWithoutAStopPassesThroughWhole) {
  StopStrings s({"###"});
  EXPECT_EQ(run(s, {"Hello", ", ", "world", "#", "!"}), "Hello, world#!");
  EXPECT_FALSE(s.stopped());
}

TEST(StopStrings, AStopSpanningPiecesIsFoundAndNeitherItNorWhatFollowsIsEmitted) {
  StopStrings s({"\nUser:"});
  std::string out;
  for (const char* p : {"Sure.", "\n", "Us", "er", ": more", " text"}) out += s.feed(p).text;
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "Sure.");
  EXPECT_EQ(s.flush(), "");
}

TEST(StopStrings, ATailThatMayStartAStopIsHeldBackUntilDecided) {
  StopStrings s({"abc"});
  StopStrings::Result r = s.feed("xxab");
  EXPECT_EQ(r.text, "xx");
  EXPECT_EQ(s.held_back(), 2u);
  r = s.feed("d");  // "abd" cannot start "abc" any more
  EXPECT_EQ(r.text, "abd");
  EXPECT_EQ(s.held_back(), 0u);
}

TEST(StopStrings, TheEarliestOfSeveralStopsWins) {
  StopStrings s({"world", "lo, "});
  const StopStrings::Result r = s.feed("Hello, world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "Hel");
  EXPECT_EQ(r.matched, "lo, ");
}

TEST(StopStrings, FlushReturnsAHeldTailThatNeverBecameAStop) {
  StopStrings s({"</s>"});
  EXPECT_EQ(s.feed("end</").text, "end");
  EXPECT_EQ(s.flush(), "</");
}

TEST(StopStrings, AStopInThePieceThatCompletesItIsCutThere) {
  StopStrings s({"STOP"});
  EXPECT_EQ(s.feed("aST").text, "a");
  const StopStrings::Result r = s.feed("OPb");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(s.feed("more").text, "");
}

// min_tokens (vLLM's detokenizer): a stop string that ends in quiet text
// does not count; one that starts there and ends later does.
TEST(StopStrings, NoStopEndsInQuietTextButOneThatEndsAfterItDoes) {
  StopStrings s({"ab", "cde"});
  EXPECT_EQ(s.feed("xab", true).text, "xab");
  EXPECT_EQ(s.feed("yabc", true).text, "yab");  // "c" may start "cde": held
  EXPECT_FALSE(s.stopped());
  const StopStrings::Result r = s.feed("de ab");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "cde");
  EXPECT_EQ(r.text, "");
  StopStrings t({"ab"});
  EXPECT_EQ(t.feed("xa", true).text, "x");
  EXPECT_TRUE(t.feed("b").stopped);
  StopStrings u({"ab"});
  EXPECT_EQ(u.feed("abab", true).text, "abab");
  EXPECT_EQ(u.feed("zab").text, "z");
}

TEST(StopStrings, EmptyStopStringIsAClearError) {
  expect_error([] { StopStrings({"a", ""}); }, {"stop string 1 is empty"});
}

}  // namespace
}  // namespace loom::infer
