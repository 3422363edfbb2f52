// TextStream: one generated sequence's text as its tokens arrive, for
// streaming (`loom generate`, the server's SSE and NDJSON chunks). Token ids
// become the tokenizer's bytes; the end-of-sequence token and ids past the
// tokenizer (a padded vocabulary) add no text, as vLLM's skip_special_tokens
// does; a UTF-8 character split across tokens is held back until it is whole,
// so every piece handed out is whole characters (bytes that can never become
// one are passed on as they are); stop strings are matched on the text with
// their own hold-back (StopStrings): the stop string and what follows it are
// never emitted. As vLLM's detokenizer: no stop string ends in the text of
// the first min_tokens tokens, and the token that ended the sequence as EOS
// or a stop token adds no text (it is shown only with
// include_stop_str_in_output, which loom does not offer).
//
//   TextStream ts(tok, {"\n\n"}, {tok.eos_id()});
//   for each token: TextStream::Piece p = ts.feed(token); emit p.text; if (p.stopped) end the sequence;
//   at the end: emit ts.flush();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "infer/stop_strings.h"
#include "text/tokenizer.h"

namespace loom::infer {

// The bytes at the end of s that begin a UTF-8 character still missing
// continuation bytes (0 to 3): what a stream holds back.
size_t incomplete_utf8_tail(const std::string& s);

class TextStream {
 public:
  // tok must outlive the stream. stops: stop strings (none empty); silent:
  // token ids that add no text (EOS); shown: control tokens that add their
  // text (a control token otherwise adds nothing); min_tokens: the request's.
  TextStream(const text::Tokenizer& tok, std::vector<std::string> stops, std::vector<int32_t> silent = {},
             text::ShownTokens shown = {}, int64_t min_tokens = 0);

  struct Piece {
    std::string text;      // safe to emit now (maybe empty)
    bool stopped = false;  // a stop string ended the text; later tokens add nothing
    std::string matched;   // the stop string
  };
  // ended: the token ended the sequence as EOS or a stop token (the
  // engine's finish reason stop): it counts, and adds no text.
  Piece feed(int32_t token, bool ended = false);
  // The end of the sequence: everything still held back.
  std::string flush();
  // Everything handed out so far (feed and flush pieces together).
  const std::string& text() const { return text_; }
  bool stopped() const { return stops_.stopped(); }

 private:
  const text::Tokenizer& tok_;
  StopStrings stops_;
  std::vector<int32_t> silent_;
  text::ShownTokens shown_;
  int64_t min_tokens_ = 0;
  int64_t num_tokens_ = 0;  // fed so far
  std::string bytes_;  // decoded bytes not yet passed to stops_ (an incomplete character)
  std::string text_;
};

}  // namespace loom::infer
