#include "infer/stop_strings.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    LOOM_REQUIRE(!stops_[i].empty(), "stop string ", i, " is empty: stop strings need at least one character");
}

StopStrings::Result StopStrings::feed(std::string_view piece, bool quiet) {
  Result r;
  if (stopped_) return r;
  pending_ += piece;
  if (quiet) quiet_ = pending_.size();
  // The earliest stop string in the text not yet emitted (the emitted text
  // held none, nor any start of one at its end) that ends past the quiet text.
  size_t at = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    const size_t p = pending_.find(s, quiet_ >= s.size() ? quiet_ - s.size() + 1 : 0);
    if (p < at || (p == at && p != std::string::npos && s.size() > which->size())) at = p, which = &s;
  }
  if (which) {
    r.text = pending_.substr(0, at);
    r.stopped = stopped_ = true;
    r.matched = *which;
    pending_.clear();
    return r;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, r.text.size());
  quiet_ -= std::min(quiet_, r.text.size());
  return r;
}

std::string StopStrings::flush() {
  std::string rest;
  rest.swap(pending_);
  quiet_ = 0;
  return rest;
}

}  // namespace loom::infer
