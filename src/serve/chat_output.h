// What a chat's answer says, read while it streams: its reasoning, its
// content and, at the end, its tool calls (vLLM's reasoning and tool
// parsers, ollama's output parsers). The template's family decides how:
//
//   harmony (gpt-oss)   messages on channels: analysis is reasoning, final
//                       content, a message to=functions.f a call (harmony.h)
//   every other family  a think block first (reasoning.h), then text that
//                       may hold calls (tool_calls.h)
//
// The OpenAI and ollama formats take the pieces and write them in their own
// fields; neither knows a family.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/reasoning.h"
#include "serve/tool_calls.h"

namespace loom::serve {

struct OutputPiece {
  std::string reasoning, content;
  std::vector<ToolCall> calls;  // only in the last piece
};

class OutputReader {
 public:
  virtual ~OutputReader() = default;
  // The next text of the answer; last: the answer ends with it (what was
  // held back comes out, and the calls with it).
  virtual OutputPiece feed(std::string_view text, bool last) = 0;
};

// How a request's answer is read.
struct OutputReading {
  ToolFormat format = ToolFormat::hermes;  // the template's family
  std::vector<std::string> tool_names;     // the functions offered (empty: none, or tool_choice "none")
  bool parallel_tool_calls = true;         // false: the first call only
  // The answer is the template's (a chat, ollama's templated generate): a
  // family that frames every answer (functionary's recipient line,
  // harmony's channels) is read even without tools.
  bool templated = false;
  // A think block is reasoning; reasoning_inside when the prompt opened it.
  bool split_reasoning = false;
  bool reasoning_inside = false;
  ThinkTags think_tags{};

  // Whether the answer is read for calls at all.
  bool reads_calls() const {
    return !tool_names.empty() ||
           (templated && (format == ToolFormat::functionary_v32 || format == ToolFormat::harmony));
  }
};

// The reader of one answer (seed: its call ids'); null when the answer is
// content as it comes.
std::unique_ptr<OutputReader> output_reader(const OutputReading& how, uint64_t seed);

}  // namespace loom::serve
