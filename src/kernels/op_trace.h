// The kernel ops of a thread, timed one by one (torch.profiler's op table,
// Nsight's kernel track): while an OpTracer is alive, every op of ops.h the
// thread calls goes through a timing table in front of its backend's. Each
// outermost call becomes
//   - a span named after the op on the thread's TraceRecorder, nested in
//     whatever span is open there (train/trainer.cpp's forward, backward...);
//   - on a device whose backend has a DeviceClock (CUDA: events on the
//     compute stream), also a span on the recorder's device track (tid 1),
//     placed where the device ran it: a GPU runs behind the host that
//     queues its work, so the host span is the launch and this one the work;
//   - a row of table(): calls, host and device time per op and device kind.
// Ops an op calls itself are not counted again. Other threads (MPI's progress
// thread, a server's workers) run untimed. The ops' results are the same bits
// with or without the tracer.
//
//   TraceRecorder rec(0, "rank 0");
//   kernels::OpTracer ops(rec);
//   for (...) { step(); ops.flush(); }   // device times arrive at flush
//   std::cout << ops.table();
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/trace.h"
#include "kernels/backend.h"

namespace loom::kernels {

class OpTracer {
 public:
  // Starts timing this thread's ops into `recorder` (which must outlive the
  // tracer). One tracer a thread: loom::Error if the thread has one.
  explicit OpTracer(TraceRecorder& recorder);
  OpTracer(const OpTracer&) = delete;
  OpTracer& operator=(const OpTracer&) = delete;
  ~OpTracer();  // flushes and stops

  // Waits for the device work of the ops timed so far and writes their
  // device spans. Cheap on the CPU; call once a step.
  void flush();

  // Per op and device kind, most time first: calls, host milliseconds, device
  // milliseconds ("-" without a device clock), mean microseconds a call
  // (device time where there is one) and share of all the ops' time.
  // Flushes first.
  std::string table();

  struct Totals {
    int64_t calls = 0;
    double host_us = 0;
    double device_us = -1;  // -1: no device clock
  };
  // Totals of op `op` (backend_op_names() index) on `kind`.
  Totals totals(size_t op, Device::Kind kind);

  // Called by the timing tables (op_trace.cpp), on the tracer's thread.
  void begin(size_t op, const Backend& b);
  void end();

 private:
  struct Open {
    size_t op;
    Device::Kind kind;
    const DeviceClock* clock;
    double host_start_us;
    void* start_mark;
  };
  struct Queued {  // a timed call whose device time flush() has yet to read
    size_t op;
    Device::Kind kind;
    const DeviceClock* clock;
    void* start_mark;
    void* end_mark;
  };

  TraceRecorder& recorder_;
  std::vector<Totals> totals_;  // [kind * op count + op]
  int depth_ = 0;               // nesting of op calls now; only depth 0 is timed
  Open open_{};
  std::vector<Queued> queued_;
  // Where the device clock's timeline meets the recorder's: a mark and its
  // time in recorder microseconds (one per clock; one device a process).
  const DeviceClock* anchor_clock_ = nullptr;
  void* anchor_ = nullptr;
  double anchor_us_ = 0;
};

}  // namespace loom::kernels
