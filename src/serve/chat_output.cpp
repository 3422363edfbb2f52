#include "serve/chat_output.h"

#include <optional>

#include "serve/harmony.h"

namespace loom::serve {
namespace {

// A think block first, then calls: each stage optional.
class SplitReader : public OutputReader {
 public:
  SplitReader(const OutputReading& how, uint64_t seed) : parallel_(how.parallel_tool_calls) {
    if (how.split_reasoning) reason_.emplace(how.reasoning_inside, how.think_tags);
    if (how.reads_calls()) tools_.emplace(how.format, how.tool_names, seed);
  }

  OutputPiece feed(std::string_view text, bool last) override {
    OutputPiece out;
    std::string shown(text);
    if (reason_) {
      ReasoningPiece p = reason_->feed(text, last);
      out.reasoning = std::move(p.reasoning);
      shown = std::move(p.content);
    }
    if (!tools_) {
      out.content = std::move(shown);
      return out;
    }
    out.content = tools_->feed(shown);
    if (last) {
      ParsedToolOutput end = tools_->finish();
      out.content += end.content;
      out.calls = std::move(end.calls);
      if (!parallel_ && out.calls.size() > 1) out.calls.resize(1);
    }
    return out;
  }

 private:
  bool parallel_;
  std::optional<ReasoningSplit> reason_;
  std::optional<ToolCallStream> tools_;
};

}  // namespace

std::unique_ptr<OutputReader> output_reader(const OutputReading& how, uint64_t seed) {
  if (how.format == ToolFormat::harmony && how.templated)
    return std::make_unique<HarmonyStream>(how.tool_names, seed, how.parallel_tool_calls);
  if (!how.split_reasoning && !how.reads_calls()) return nullptr;
  return std::make_unique<SplitReader>(how, seed);
}

}  // namespace loom::serve
