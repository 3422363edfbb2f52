// Stop strings on streamed text. Text arrives in pieces (each new token's
// text); a stop string may span pieces, so the tail that could still be the
// start of one is held back until the next piece decides. The stop string
// itself is never emitted (OpenAI's and ollama's behaviour), nor anything
// after it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::infer {

class StopStrings {
 public:
  // Empty strings are not allowed (loom::Error naming the index).
  explicit StopStrings(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was found: text ends just before it
    std::string matched;   // which one
  };
  // The next piece. After a stop, every later piece returns nothing.
  // quiet: text of the first min_tokens tokens, where no stop string may
  // end (vLLM's detokenizer moves its stop check past that text); one that
  // starts in it and ends in a later piece still stops.
  Result feed(std::string_view piece, bool quiet = false);
  // The end of the output (any finish reason): the held-back tail, which
  // turned out not to start a stop string.
  std::string flush();
  bool stopped() const { return stopped_; }
  size_t held_back() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text not yet emitted: a suffix that is a prefix of some stop string
  size_t quiet_ = 0;     // the first quiet_ bytes of pending_ came in quiet pieces
  bool stopped_ = false;
};

}  // namespace loom::infer
