#include "bench/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "comm/mpi_backend.h"
#include "core/error.h"
#include "core/log.h"

namespace loom::bench {
namespace {

using comm::Communicator;
using comm::WorkPtr;

// One collective of `bytes` of f32 (rounded down to what the op can split).
struct Case {
  std::string op;
  int64_t count = 0;  // elements of the full buffer
  std::vector<float> a, b;

  Case(const std::string& op_, int64_t bytes, const Communicator& c) : op(op_) {
    count = bytes / static_cast<int64_t>(sizeof(float));
    if (op == "all_to_all") count -= count % c.size();
    const int64_t shard = comm::shard_range(count, c.size(), c.rank()).count;
    a.assign(count, 1.0f);
    b.assign(op == "reduce_scatter" || op == "all_gather" ? shard : op == "all_to_all" ? count : 0, 1.0f);
  }
  WorkPtr run(Communicator& c) {
    Tensor full(a.data(), DType::f32, {count});
    Tensor part(b.data(), DType::f32, {static_cast<int64_t>(b.size())});
    if (op == "all_reduce") return c.all_reduce(full, comm::ReduceOp::sum);
    if (op == "reduce_scatter") return c.reduce_scatter(part, full, comm::ReduceOp::sum);
    if (op == "all_gather") return c.all_gather(full, part);
    return c.all_to_all(part, full);
  }
  double bus_factor(int n) const { return op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n; }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The slowest rank's value: a collective is as fast as its last member.
double max_over_ranks(Communicator& c, double x) {
  float v = static_cast<float>(x);
  c.all_reduce(Tensor(&v, DType::f32, {1}), comm::ReduceOp::max)->wait();
  return v;
}

// Median per-iteration seconds over ranks' medians, after warm-up; about
// 1 s per size, between 3 and opts.iters iterations (the same on every rank).
double time_case(Communicator& c, Case& k, const CommBenchOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < opts.warmup; ++i) k.run(c)->wait();
  const double warm = max_over_ranks(c, seconds_since(t0) / std::max(1, opts.warmup));
  const int iters = std::clamp(static_cast<int>(1.0 / std::max(warm, 1e-9)), 3, std::max(3, opts.iters));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    c.barrier()->wait();
    t0 = std::chrono::steady_clock::now();
    k.run(c)->wait();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return max_over_ranks(c, times[times.size() / 2]);
}

}  // namespace

int64_t parse_bytes(std::string_view text) {
  int64_t unit = 1;
  std::string_view digits = text;
  if (!text.empty()) {
    const char last = text.back();
    const int64_t units[] = {int64_t{1} << 10, int64_t{1} << 20, int64_t{1} << 30};
    const char* suffix = "KMG";
    for (int i = 0; i < 3; ++i)
      if (last == suffix[i] || last == suffix[i] + ('a' - 'A')) {
        unit = units[i];
        digits = text.substr(0, text.size() - 1);
      }
  }
  const bool numeric = !digits.empty() && digits.size() <= 12 &&
                       std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  LOOM_REQUIRE(numeric, "size '", text, "' is invalid: use bytes with an optional K, M or G suffix (e.g. 1K, 256M)");
  const int64_t value = std::stoll(std::string(digits));  // at most 12 digits: no overflow
  LOOM_REQUIRE(value <= kMaxBenchBytes / unit, "bench comm: --min/--max size '", text, "' is out of range: allowed 4 to ", kMaxBenchBytes,
               " bytes (2^31-1 f32 elements, MPI's per-message limit)");
  return value * unit;
}

int run_comm_bench(const CommBenchOptions& opts) {
  LOOM_REQUIRE(opts.min_bytes >= 4 && opts.min_bytes <= opts.max_bytes && opts.max_bytes <= kMaxBenchBytes,
               "bench comm: --min ", opts.min_bytes, " and --max ", opts.max_bytes, " bytes: need 4 <= min <= max <= ",
               kMaxBenchBytes, " (2^31-1 f32 elements)");
  comm::Options copts;
  copts.algo = comm::algo_from_name(opts.algo);
  copts.check_collectives = opts.check_collectives;
  auto world = comm::mpi_world(copts);
  set_log_rank(world->rank(), world->size());
  const bool print = world->rank() == 0;
  const int n = world->size();
  if (print && !opts.json)
    std::printf("loom bench comm: %s, algo %s, %d ranks, f32%s; median over iterations, slowest rank\n"
                "reproduce: %s\n\n%12s %12s %12s %12s\n",
                opts.op.c_str(), opts.algo.c_str(), n, opts.check_collectives ? ", --check-collectives" : "",
                opts.command.c_str(), "size_bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
  for (int64_t bytes = opts.min_bytes; bytes <= opts.max_bytes; bytes *= 2) {
    Case k(opts.op, bytes, *world);
    const double s = time_case(*world, k, opts);
    const int64_t size = k.count * static_cast<int64_t>(sizeof(float));
    const double algbw = static_cast<double>(size) / s / 1e9;
    const double busbw = algbw * k.bus_factor(n);
    if (!print) continue;
    if (opts.json)
      std::printf("{\"op\":\"%s\",\"algo\":\"%s\",\"ranks\":%d,\"size_bytes\":%lld,\"seconds\":%.9g,"
                  "\"algbw_gbps\":%.6g,\"busbw_gbps\":%.6g}\n",
                  opts.op.c_str(), opts.algo.c_str(), n, static_cast<long long>(size), s, algbw, busbw);
    else
      std::printf("%12lld %12.1f %12.3f %12.3f\n", static_cast<long long>(size), s * 1e6, algbw, busbw);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace loom::bench
