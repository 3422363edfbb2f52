// The op tracer (op_trace.h): a timing table per device kind, generated from
// LOOM_KERNEL_OPS, whose entries time the call and pass it on to the kind's
// registered table; dispatch (backend.cpp) hands it out instead of the real
// one on a thread that has a tracer.
#include "kernels/op_trace.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "kernels/dispatch.h"

namespace loom::kernels {
namespace {

constexpr size_t kKinds = 2;  // Device::Kind: cpu, cuda

enum OpIndex : size_t {
#define LOOM_KERNEL_OP_INDEX(op, ret, params) k_##op,
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_INDEX)
#undef LOOM_KERNEL_OP_INDEX
      kOpCount
};

thread_local OpTracer* t_tracer = nullptr;

Device device_of_kind(Device::Kind kind) { return kind == Device::Kind::cpu ? Device::cpu() : Device::cuda(0); }

// An entry of the timing table of kind K: times op I, then calls the real one.
template <typename F>
struct Timed;
template <typename R, typename... A>
struct Timed<R (*)(A...)> {
  template <R (*Backend::*Entry)(A...), Device::Kind K, size_t I>
  static R call(A... args) {
    const Backend& b = *find_backend(device_of_kind(K));
    OpTracer* tracer = t_tracer;
    if (tracer == nullptr) return (b.*Entry)(std::forward<A>(args)...);  // the tracer ended mid-dispatch
    tracer->begin(I, b);
    struct End {
      OpTracer* t;
      ~End() { t->end(); }
    } end{tracer};
    return (b.*Entry)(std::forward<A>(args)...);
  }
};

template <Device::Kind K>
constexpr Backend timing_table() {
  Backend b;
  b.name = "op tracer";
  b.kind = K;
#define LOOM_KERNEL_OP_TIMED(op, ret, params) \
  b.op = &Timed<decltype(Backend::op)>::template call<&Backend::op, K, k_##op>;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_TIMED)
#undef LOOM_KERNEL_OP_TIMED
  return b;
}

constexpr std::array<Backend, kKinds> kTimingTables{timing_table<Device::Kind::cpu>(),
                                                    timing_table<Device::Kind::cuda>()};

const char* kind_name(Device::Kind kind) { return kind == Device::Kind::cpu ? "cpu" : "cuda"; }

}  // namespace

namespace detail {

const Backend* traced_table(const Backend& real) {
  if (t_tracer == nullptr) return &real;
  return &kTimingTables[static_cast<size_t>(real.kind)];
}

}  // namespace detail

OpTracer::OpTracer(TraceRecorder& recorder) : recorder_(recorder), totals_(kKinds * kOpCount) {
  LOOM_REQUIRE(t_tracer == nullptr, "an OpTracer already times this thread's ops");
  t_tracer = this;
}

OpTracer::~OpTracer() {
  t_tracer = nullptr;
  try {
    flush();
  } catch (...) {  // a device error was reported by the op that met it
  }
  if (anchor_ != nullptr) anchor_clock_->release(anchor_);
}

void OpTracer::begin(size_t op, const Backend& b) {
  if (depth_++ > 0) return;
  const DeviceClock* clock = b.kind == Device::Kind::cpu ? nullptr : b.clock;
  if (clock != nullptr && anchor_ == nullptr) {
    // The device's timeline starts here: once the device has reached this
    // mark, its time is now on the host.
    anchor_clock_ = clock;
    anchor_ = clock->mark();
    clock->elapsed_us(anchor_, anchor_);
    anchor_us_ = recorder_.now_us();
    recorder_.name_track(1, "device");
  }
  recorder_.begin(backend_op_names()[op]);
  open_ = {op, b.kind, clock, recorder_.now_us(), clock != nullptr ? clock->mark() : nullptr};
}

void OpTracer::end() {
  if (--depth_ > 0) return;
  // The device's mark first: the host's span then holds the device's when
  // the device runs an op before it returns (a CPU-like device).
  if (open_.clock != nullptr)
    queued_.push_back({open_.op, open_.kind, open_.clock, open_.start_mark, open_.clock->mark()});
  Totals& t = totals_[static_cast<size_t>(open_.kind) * kOpCount + open_.op];
  t.calls += 1;
  t.host_us += recorder_.now_us() - open_.host_start_us;
  recorder_.end();
}

void OpTracer::flush() {
  if (queued_.empty()) return;
  const DeviceClock* clock = anchor_clock_;
  for (const Queued& q : queued_) {
    LOOM_CHECK(q.clock == clock, "OpTracer: ops on two device clocks");
    const double start = anchor_us_ + clock->elapsed_us(anchor_, q.start_mark);
    const double dur = std::max(0.0, clock->elapsed_us(q.start_mark, q.end_mark));
    recorder_.add(backend_op_names()[q.op], 1, start, dur);
    Totals& t = totals_[static_cast<size_t>(q.kind) * kOpCount + q.op];
    t.device_us = std::max(0.0, t.device_us) + dur;
  }
  // The last mark anchors the next flush, so that no span is measured from
  // far away (a float's milliseconds lose microseconds after minutes).
  const Queued& last = queued_.back();
  const double last_us = anchor_us_ + clock->elapsed_us(anchor_, last.end_mark);
  clock->release(anchor_);
  anchor_ = last.end_mark;
  anchor_us_ = last_us;
  for (const Queued& q : queued_) {
    clock->release(q.start_mark);
    if (q.end_mark != anchor_) clock->release(q.end_mark);
  }
  queued_.clear();
}

OpTracer::Totals OpTracer::totals(size_t op, Device::Kind kind) {
  LOOM_CHECK(op < kOpCount, "OpTracer::totals: op ", op);
  flush();
  return totals_[static_cast<size_t>(kind) * kOpCount + op];
}

std::string OpTracer::table() {
  flush();
  struct Row {
    size_t op;
    Device::Kind kind;
    Totals t;
    double time_us;
  };
  std::vector<Row> rows;
  double all_us = 0;
  for (size_t k = 0; k < kKinds; ++k)
    for (size_t op = 0; op < kOpCount; ++op) {
      const Totals& t = totals_[k * kOpCount + op];
      if (t.calls == 0) continue;
      const double us = t.device_us >= 0 ? t.device_us : t.host_us;
      rows.push_back({op, static_cast<Device::Kind>(k), t, us});
      all_us += us;
    }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.time_us > b.time_us; });
  std::string out = "op                               device     calls    host ms  device ms   mean us  share\n";
  char line[160];
  for (const Row& r : rows) {
    char device_ms[32] = "-";
    if (r.t.device_us >= 0) std::snprintf(device_ms, sizeof device_ms, "%.3f", r.t.device_us / 1e3);
    std::snprintf(line, sizeof line, "%-32s %-6s %9lld %10.3f %10s %9.1f %5.1f%%\n", backend_op_names()[r.op],
                  kind_name(r.kind), static_cast<long long>(r.t.calls), r.t.host_us / 1e3, device_ms,
                  r.time_us / static_cast<double>(r.t.calls), all_us > 0 ? 100 * r.time_us / all_us : 0.0);
    out += line;
  }
  out += concat("all ops: ", all_us / 1e3, " ms (device time where the device has a clock, else host time)\n");
  return out;
}

}  // namespace loom::kernels
