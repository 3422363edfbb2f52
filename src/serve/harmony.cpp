#include "serve/harmony.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

namespace loom::serve {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kStart = "<|start|>", kChannel = "<|channel|>", kMessage = "<|message|>",
                           kConstrain = "<|constrain|>", kEnd = "<|end|>", kCall = "<|call|>", kReturn = "<|return|>";
constexpr std::string_view kFunctions = "functions.";
// A header longer than this is not one: the answer is read as plain text.
constexpr size_t kMaxHeader = 256;

// What ends a message's text: its end markers, and (for a model that leaves
// the end out) the start of the next header, which stays for it.
constexpr std::array<std::string_view, 3> kEnds = {kEnd, kCall, kReturn};
constexpr std::array<std::string_view, 2> kNextHeader = {kStart, kChannel};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// The word after key in a header (up to a space or the next marker); ""
// when the header has no key.
std::string_view word_after(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  const std::string_view rest = header.substr(at + key.size());
  size_t n = 0;
  while (n < rest.size() && rest[n] != ' ' && rest[n] != '<' && rest[n] != '\n') ++n;
  return rest.substr(0, n);
}

// Whether h (its leading blanks gone) may be or become a header: it starts
// with a marker or a recipient ("to="), or is the start of one, and is not
// too long.
bool may_be_header(std::string_view h) {
  if (h.size() > kMaxHeader) return false;
  for (const std::string_view start : {std::string_view("<|"), std::string_view("to=")})
    if (h.starts_with(start) || start.starts_with(h)) return true;
  return false;
}

// How many bytes at the end of s may begin a marker that ends the text (the
// longest of them is <|channel|>).
size_t held_back(std::string_view s) {
  for (size_t keep = std::min<size_t>(s.size(), kChannel.size()); keep > 0; --keep) {
    const std::string_view tail = s.substr(s.size() - keep);
    for (const std::string_view m : kEnds)
      if (m.starts_with(tail)) return keep;
    for (const std::string_view m : kNextHeader)
      if (m.starts_with(tail)) return keep;
  }
  return 0;
}

}  // namespace

bool is_harmony_template(std::string_view source) {
  return source.find(kChannel) != std::string_view::npos && source.find(kMessage) != std::string_view::npos;
}

std::string harmony_final_header() { return std::string(kChannel) + "final" + std::string(kMessage); }

std::string harmony_call_header(const std::string& name) {
  return std::string(kChannel) + "commentary to=" + std::string(kFunctions) + name + " " + std::string(kConstrain) +
         "json" + std::string(kMessage);
}

HarmonyTokens harmony_tokens(const text::Tokenizer& tok) {
  const auto single = [&tok](std::string_view text) {
    const std::vector<int32_t> ids = tok.encode_special(text);
    return ids.size() == 1 ? ids[0] : -1;
  };
  HarmonyTokens t;
  for (const std::string_view m : {kStart, kChannel, kMessage, kConstrain, kEnd})
    if (const int32_t id = single(m); id >= 0 && tok.token_bytes(id) != m) t.shown.emplace_back(id, std::string(m));
  for (const std::string_view m : {kReturn, kCall, std::string_view("<|endoftext|>")})
    if (const int32_t id = single(m); id >= 0) t.end.push_back(id);
  return t;
}

HarmonyStream::HarmonyStream(std::vector<std::string> names, uint64_t seed, bool parallel)
    : names_(std::move(names)), seed_(seed), parallel_(parallel) {}

void HarmonyStream::begin(std::string_view header) {
  const std::string_view channel = word_after(header, kChannel);
  const std::string_view recipient = word_after(header, "to=");
  kind_ = channel == "analysis" && recipient.empty() ? Kind::reasoning : Kind::content;
  if (recipient.starts_with(kFunctions)) {
    const std::string name(recipient.substr(kFunctions.size()));
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
      kind_ = Kind::call;
      name_ = name;
    }
  }
  joined_ = false;
}

void HarmonyStream::emit(std::string_view text, OutputPiece& out) {
  if (text.empty()) return;
  if (kind_ == Kind::call) {
    body_ += text;
    return;
  }
  const size_t k = kind_ == Kind::reasoning ? 0 : 1;
  std::string& into = k == 0 ? out.reasoning : out.content;
  if (!joined_ && said_[k]) into += '\n';
  joined_ = said_[k] = true;
  into += text;
}

void HarmonyStream::end_message(OutputPiece& out) {
  if (kind_ == Kind::call) {
    const ojson args = ojson::parse(trim(body_), nullptr, false);
    if (args.is_object()) {
      calls_.push_back({.id = {}, .name = name_, .arguments = args});
    } else {  // not arguments: the text stays, as content
      kind_ = Kind::content;
      emit(body_, out);
    }
    body_.clear();
  }
  state_ = State::header;
}

OutputPiece HarmonyStream::feed(std::string_view text, bool last) {
  OutputPiece out;
  pending_ += text;
  while (true) {
    if (state_ == State::raw) {
      out.content += pending_;
      pending_.clear();
      break;
    }
    if (state_ == State::header) {
      pending_.erase(0, std::min(pending_.size(), pending_.find_first_not_of(" \t\r\n")));  // blanks between messages
      const size_t at = pending_.find(kMessage);
      if (at == std::string::npos || !may_be_header(std::string_view(pending_).substr(0, at))) {
        if (at == std::string::npos && may_be_header(pending_) && !last) break;  // wait for more
        // Not harmony (or an answer that ends before its header does, which
        // is not one either unless it starts with a marker): plain text.
        if (at == std::string::npos && last && pending_.starts_with("<|")) break;
        state_ = State::raw;
        continue;
      }
      begin(std::string_view(pending_).substr(0, at));
      pending_.erase(0, at + kMessage.size());
      state_ = State::body;
      continue;
    }
    // The message's text, up to whichever end comes first.
    size_t end = std::string::npos, skip = 0;
    for (const std::string_view m : kEnds)
      if (const size_t at = pending_.find(m); at < end) end = at, skip = m.size();
    for (const std::string_view m : kNextHeader)
      if (const size_t at = pending_.find(m); at < end) end = at, skip = 0;
    if (end == std::string::npos) {
      const size_t keep = last ? 0 : held_back(pending_);
      emit(std::string_view(pending_).substr(0, pending_.size() - keep), out);
      pending_.erase(0, pending_.size() - keep);
      if (last) end_message(out);
      break;
    }
    emit(std::string_view(pending_).substr(0, end), out);
    pending_.erase(0, end + skip);
    end_message(out);
  }
  if (!last) return out;
  pending_.clear();  // an unfinished header (it starts with a marker): nothing of the answer
  if (!parallel_ && calls_.size() > 1) calls_.resize(1);
  for (size_t i = 0; i < calls_.size(); ++i)
    calls_[i].id = tool_call_id(ToolFormat::harmony, seed_, static_cast<int64_t>(i));
  out.calls = std::move(calls_);
  calls_.clear();
  return out;
}

}  // namespace loom::serve
