// A timeline of a run in the Chrome trace event format (the JSON that
// Perfetto and chrome://tracing open): named spans on the calling thread,
// timed with steady_clock from a given start (train/trainer.cpp takes every
// rank's right after a barrier, so the ranks' tracks line up).
//
//   TraceRecorder rec(rank, "rank 0");
//   { TraceSpan s(&rec, "forward"); ... }          // a complete ("X") event
//   write_file_atomic(path, trace_document(rec.jsonl()));
//
// A recorder belongs to one thread: spans nest (begin/end as a stack) and
// each becomes one event with "ts"/"dur" in microseconds since `start`.
// Several ranks' traces merge by concatenating their jsonl() before
// trace_document(); each rank is one process ("pid") with its own track.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

struct TraceEvent {
  std::string name;
  int tid = 0;          // the track within the process: 0 the recording thread
  double start_us = 0;  // since the recorder's start
  double dur_us = -1;   // -1 while the span is open
};

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // pid: this process's track; process_name: the track's label.
  TraceRecorder(int pid, std::string process_name, Clock::time_point start = Clock::now());

  void begin(std::string_view name);
  // Closes the innermost open span; LOOM_CHECK that one is open.
  void end();
  // Microseconds since the recorder's start.
  double now_us() const;
  // A span timed elsewhere, on track `tid` (> 0: not the recording thread's,
  // whose spans nest by begin/end), named by name_track.
  void add(std::string_view name, int tid, double start_us, double dur_us);
  void name_track(int tid, std::string_view name);

  // In begin order, so a span comes before the spans nested in it.
  const std::vector<TraceEvent>& events() const { return events_; }
  int pid() const { return pid_; }

  // One JSON object a line: the process_name and thread_name metadata
  // events, then every closed span as a complete event. Open spans are left
  // out.
  std::string jsonl() const;

 private:
  int pid_;
  std::string process_name_;
  Clock::time_point start_;
  std::vector<TraceEvent> events_;
  std::vector<size_t> open_;  // indices into events_, innermost last
  std::vector<std::pair<int, std::string>> track_names_;
};

// RAII span; a null recorder makes it a no-op (tracing off costs a branch).
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* recorder, std::string_view name) : recorder_(recorder) {
    if (recorder_ != nullptr) recorder_->begin(name);
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  ~TraceSpan() {
    if (recorder_ != nullptr) recorder_->end();
  }

 private:
  TraceRecorder* recorder_;
};

// s as the contents of a JSON string: quote, backslash and control
// characters escaped; other bytes (UTF-8 included) as they are.
std::string json_escape(std::string_view s);

// The whole trace file: {"traceEvents": [...], "displayTimeUnit": "ms"}
// holding every line of `jsonl` (blank lines skipped) as one event.
std::string trace_document(std::string_view jsonl);

}  // namespace loom
