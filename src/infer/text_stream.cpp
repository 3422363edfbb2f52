#include "infer/text_stream.h"

#include <algorithm>
#include <span>

namespace loom::infer {

size_t incomplete_utf8_tail(const std::string& s) {
  // Walk back over at most 3 continuation bytes (10xxxxxx) to a lead byte.
  const size_t n = s.size();
  for (size_t k = 1; k <= std::min<size_t>(n, 4); ++k) {
    const auto c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for its lead
    size_t need = 0;                   // the character's length by its lead byte
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > k ? k : 0;  // ASCII, complete, or a byte that leads nothing: nothing to wait for
  }
  return 0;  // only continuation bytes: no lead to complete them
}

TextStream::TextStream(const text::Tokenizer& tok, std::vector<std::string> stops, std::vector<int32_t> silent,
                       text::ShownTokens shown, int64_t min_tokens)
    : tok_(tok), stops_(std::move(stops)), silent_(std::move(silent)), shown_(std::move(shown)),
      min_tokens_(min_tokens) {}

TextStream::Piece TextStream::feed(int32_t token, bool ended) {
  Piece p;
  if (stops_.stopped()) return p;
  ++num_tokens_;
  const bool silent = ended || token < 0 || token >= tok_.vocab_size() ||
                      std::find(silent_.begin(), silent_.end(), token) != silent_.end();
  const auto shown = std::find_if(shown_.begin(), shown_.end(), [token](const auto& s) { return s.first == token; });
  if (!silent) bytes_ += shown != shown_.end() ? shown->second : tok_.token_bytes(token);
  const size_t hold = incomplete_utf8_tail(bytes_);
  StopStrings::Result r =
      stops_.feed(std::string_view(bytes_).substr(0, bytes_.size() - hold), num_tokens_ <= min_tokens_);
  bytes_.erase(0, bytes_.size() - hold);
  p.text = std::move(r.text);
  p.stopped = r.stopped;
  p.matched = std::move(r.matched);
  text_ += p.text;
  return p;
}

std::string TextStream::flush() {
  std::string rest;
  if (!stops_.stopped()) {
    // A character that never completed goes out as its bytes, after the stop check.
    StopStrings::Result r = stops_.feed(bytes_);
    rest = r.text + (r.stopped ? std::string() : stops_.flush());
  }
  bytes_.clear();
  text_ += rest;
  return rest;
}

}  // namespace loom::infer
