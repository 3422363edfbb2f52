#include "core/trace.h"

#include <cstdio>
#include <utility>

#include "core/error.h"

namespace loom {

TraceRecorder::TraceRecorder(int pid, std::string process_name, Clock::time_point start)
    : pid_(pid), process_name_(std::move(process_name)), start_(start) {}

void TraceRecorder::begin(std::string_view name) {
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
  open_.push_back(events_.size());
  events_.push_back({std::string(name), us, -1});
}

void TraceRecorder::end() {
  LOOM_CHECK(!open_.empty(), "TraceRecorder::end without an open span");
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
  TraceEvent& e = events_[open_.back()];
  open_.pop_back();
  e.dur_us = us - e.start_us;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string TraceRecorder::jsonl() const {
  std::string out = concat(R"({"name": "process_name", "ph": "M", "pid": )", pid_, R"(, "tid": 0, "args": {"name": ")",
                           json_escape(process_name_), "\"}}\n");
  char buf[128];
  for (const TraceEvent& e : events_) {
    if (e.dur_us < 0) continue;
    std::snprintf(buf, sizeof buf, R"(", "ph": "X", "pid": %d, "tid": 0, "ts": %.3f, "dur": %.3f})", pid_,
                  e.start_us, e.dur_us);
    out += "{\"name\": \"" + json_escape(e.name) + buf + "\n";
  }
  return out;
}

std::string trace_document(std::string_view jsonl) {
  std::string out = "{\"traceEvents\": [";
  bool first = true;
  size_t pos = 0;
  while (pos < jsonl.size()) {
    size_t eol = jsonl.find('\n', pos);
    if (eol == std::string_view::npos) eol = jsonl.size();
    const std::string_view line = jsonl.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    out += first ? "\n" : ",\n";
    out += line;
    first = false;
  }
  out += "\n], \"displayTimeUnit\": \"ms\"}\n";
  return out;
}

}  // namespace loom
