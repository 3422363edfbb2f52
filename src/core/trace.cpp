#include "core/trace.h"

#include <cstdio>
#include <utility>

#include "core/error.h"

namespace loom {

TraceRecorder::TraceRecorder(int pid, std::string process_name, Clock::time_point start)
    : pid_(pid), process_name_(std::move(process_name)), start_(start) {}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
}

void TraceRecorder::begin(std::string_view name) {
  const double us = now_us();
  open_.push_back(events_.size());
  events_.push_back({std::string(name), 0, us, -1});
}

void TraceRecorder::end() {
  LOOM_CHECK(!open_.empty(), "TraceRecorder::end without an open span");
  const double us = now_us();
  TraceEvent& e = events_[open_.back()];
  open_.pop_back();
  e.dur_us = us - e.start_us;
}

void TraceRecorder::add(std::string_view name, int tid, double start_us, double dur_us) {
  LOOM_CHECK(tid > 0 && dur_us >= 0, "TraceRecorder::add: tid ", tid, ", dur ", dur_us);
  events_.push_back({std::string(name), tid, start_us, dur_us});
}

void TraceRecorder::name_track(int tid, std::string_view name) { track_names_.emplace_back(tid, std::string(name)); }

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
  for (const auto& [tid, name] : track_names_)
    out += concat(R"({"name": "thread_name", "ph": "M", "pid": )", pid_, R"(, "tid": )", tid,
                  R"(, "args": {"name": ")", json_escape(name), "\"}}\n");
  char buf[128];
  for (const TraceEvent& e : events_) {
    if (e.dur_us < 0) continue;
    std::snprintf(buf, sizeof buf, R"(", "ph": "X", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f})", pid_, e.tid,
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
