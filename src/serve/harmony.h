// gpt-oss's answers, written in OpenAI's harmony format: a sequence of
// messages, each a header, <|message|>, the text, and an end. The chat
// template's generation prompt ends with "<|start|>assistant", so an answer
// reads
//
//   <|channel|>analysis<|message|>THOUGHTS<|end|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//
// or, calling a tool (the recipient may also stand before the channel:
// "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>"),
//
//   <|channel|>analysis<|message|>THOUGHTS<|end|>
//   <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>
//
// HarmonyStream reads it: analysis messages are reasoning; final messages,
// and commentary with no recipient (a preamble to the user), are content;
// a message to functions.NAME for an offered NAME whose text is a JSON
// object is a call. A message to any other recipient (a built-in tool not
// offered, an unknown function) or a call whose arguments do not parse is
// content, so nothing the model wrote is lost. Two messages of the same
// kind are joined by a newline. An answer that does not start like a
// header (a model that ignores the format) is content as it comes.
//
// The markers are control tokens, which decode to nothing (text/tokenizer.h):
// the server shows these ones as their text in a harmony model's output
// (harmony_tokens), so the reader sees them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/chat_output.h"
#include "text/tokenizer.h"

namespace loom::serve {

// Whether a chat template writes harmony (gpt-oss's).
bool is_harmony_template(std::string_view template_source);

// What the header of the final channel's message is (the text a constrained
// answer starts with), and of a call to functions.name.
std::string harmony_final_header();
std::string harmony_call_header(const std::string& name);

// A tokenizer's harmony tokens: the markers a stream shows as their text,
// and the tokens that end an answer (<|return|>, <|call|>, <|endoftext|>).
// A marker the vocabulary lacks is missing from both (its text, spelled by
// other tokens, is read all the same).
struct HarmonyTokens {
  std::vector<std::pair<int32_t, std::string>> shown;
  std::vector<int32_t> end;
};
HarmonyTokens harmony_tokens(const text::Tokenizer& tok);

class HarmonyStream : public OutputReader {
 public:
  // names: the functions offered; seed: the calls' ids; parallel: false
  // keeps the first call only.
  HarmonyStream(std::vector<std::string> names, uint64_t seed, bool parallel = true);
  OutputPiece feed(std::string_view text, bool last) override;

 private:
  enum class State { header, body, raw };
  enum class Kind { reasoning, content, call };
  void begin(std::string_view header);
  void emit(std::string_view text, OutputPiece& out);
  void end_message(OutputPiece& out);

  std::vector<std::string> names_;
  uint64_t seed_;
  bool parallel_;
  State state_ = State::header;
  Kind kind_ = Kind::content;
  std::string name_;     // a call's function
  std::string pending_;  // the header read so far, or text not yet emitted
  std::string body_;     // a call's arguments
  bool said_[2] = {false, false};  // reasoning, content: some text of the kind came out
  bool joined_ = false;            // this message's separator is out (or not needed)
  std::vector<ToolCall> calls_;
};

}  // namespace loom::serve
