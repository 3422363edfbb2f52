#include "plan/calibrate.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "core/bandwidth.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/threads.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace loom::plan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The OpenMP thread count for one measurement, restored after it.
class ThreadsScope {
 public:
  explicit ThreadsScope(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadsScope() { set_num_threads(saved_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int saved_;
};

void check_options(const CalibrateOptions& o) {
  LOOM_REQUIRE(o.threads >= 1, "calibrate: threads must be at least 1, got ", o.threads);
  LOOM_REQUIRE(o.seconds_per_measure > 0 && std::isfinite(o.seconds_per_measure),
               "calibrate: seconds_per_measure must be a positive number, got ", o.seconds_per_measure);
  LOOM_REQUIRE(!o.gemm_shapes.empty(), "calibrate: needs at least one GEMM shape");
  LOOM_REQUIRE(o.gemm_counts.empty() || o.gemm_counts.size() == o.gemm_shapes.size(), "calibrate: ",
               o.gemm_counts.size(), " GEMM counts for ", o.gemm_shapes.size(), " shapes: give one per shape or none");
  for (double n : o.gemm_counts)
    LOOM_REQUIRE(n > 0 && std::isfinite(n), "calibrate: a GEMM count must be a positive number, got ", n);
  for (const GemmShape& s : o.gemm_shapes)
    LOOM_REQUIRE(s.m >= 1 && s.n >= 1 && s.k >= 1, "calibrate: a GEMM shape needs M, N, K >= 1, got (", s.m,
                 ", ", s.n, ", ", s.k, ")");
  LOOM_REQUIRE(o.bandwidth_bytes == 0 || o.bandwidth_bytes >= 8,
               "calibrate: bandwidth_bytes must be 0 (automatic) or at least 8, got ", o.bandwidth_bytes);
  // 1 MiB: the bandwidth term shows above the latency (and its noise)
  // wherever a link is faster than ~10 GB/s per 100 us of latency.
  LOOM_REQUIRE(o.max_message_bytes >= (int64_t{1} << 20) && o.max_message_bytes % 8 == 0,
               "calibrate: max_message_bytes must be a multiple of 8 of at least 1 MiB (so the bandwidth term "
               "shows above the latency), got ", o.max_message_bytes);
}

// ---- compute: loom's GEMM ------------------------------------------------

// FLOP/s of c (M, N) = a (M, K) @ b (N, K)^T: one untimed call (oneDNN
// builds its kernel, the pages are touched), then repeats until min_seconds
// have passed and at least 3 times; the best repetition counts (the machine
// may be shared: the minimum is the most reproducible statistic, as in
// `loom bench kernels`).
double gemm_flops(DType dtype, const GemmShape& s, double min_seconds) {
  Pools pools;
  Pool& pool = pools[MemTag::workspace];
  OwnedTensor a = pool.empty(dtype, {s.m, s.k}), b = pool.empty(dtype, {s.n, s.k}), c = pool.empty(dtype, {s.m, s.n});
  kernels::fill(a, 0.5f);
  kernels::fill(b, 0.25f);
  const kernels::MatmulOpts opts{.trans_b = true};
  kernels::matmul(c, a, b, opts);
  double best = std::numeric_limits<double>::infinity();
  const Clock::time_point start = Clock::now();
  for (int reps = 0; reps < 3 || seconds_since(start) < min_seconds; ++reps) {
    const Clock::time_point t0 = Clock::now();
    kernels::matmul(c, a, b, opts);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) / best;
}

// The median over the shapes of each one's best rate: no single shape's
// blocking luck (or bad luck) sets the figure. With counts, the shapes'
// FLOPs over their time (a FLOP-weighted harmonic mean).
double achieved_gemm_flops(DType dtype, const CalibrateOptions& o) {
  std::vector<double> rates;
  for (const GemmShape& s : o.gemm_shapes) rates.push_back(gemm_flops(dtype, s, o.seconds_per_measure));
  if (!o.gemm_counts.empty()) {
    double flops = 0, seconds = 0;
    for (size_t i = 0; i < rates.size(); ++i) {
      const GemmShape& s = o.gemm_shapes[i];
      const double f = o.gemm_counts[i] * 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) *
                       static_cast<double>(s.k);
      flops += f, seconds += f / rates[i];
    }
    return flops / seconds;
  }
  std::sort(rates.begin(), rates.end());
  const size_t h = rates.size() / 2;
  return rates.size() % 2 == 1 ? rates[h] : (rates[h - 1] + rates[h]) / 2;
}

// ---- cores and memory ----------------------------------------------------

constexpr int kMaskWords = CPU_SETSIZE / 64;

// This process's affinity mask as 64-bit words (all zero if the OS will not say).
std::vector<int64_t> affinity_words() {
  std::vector<int64_t> words(kMaskWords, 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return words;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) words[cpu / 64] |= int64_t{1} << (cpu % 64);
  return words;
}

int popcount(std::span<const int64_t> words) {
  int n = 0;
  for (int64_t w : words) n += std::popcount(static_cast<uint64_t>(w));
  return n;
}

// The cores this process may run on (hardware_concurrency where the OS will not say).
int own_cores() {
  const int n = popcount(affinity_words());
  return n > 0 ? n : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The cores the job's ranks may run on: the union of their masks (mpirun
// binds each of 2 ranks to a core of its own; more ranks share every core).
// Collective over world.
int job_cores(comm::Communicator& world) {
  std::vector<int64_t> mine = affinity_words(), all(static_cast<size_t>(kMaskWords) * world.size());
  world.all_gather(Tensor(all.data(), DType::i64, {static_cast<int64_t>(all.size())}),
                   Tensor(mine.data(), DType::i64, {kMaskWords}))
      ->wait();
  std::vector<int64_t> joined(kMaskWords, 0);
  for (size_t i = 0; i < all.size(); ++i) joined[i % kMaskWords] |= all[i];
  const int n = popcount(joined);
  return n > 0 ? n : own_cores();
}

// max(512 MiB, 4 x the last-level cache): a streamed buffer the caches
// cannot hold (server CPUs have L3s of hundreds of MiB).
int64_t default_bandwidth_bytes() {
  long cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (cache <= 0) cache = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::max(int64_t{512} << 20, 4 * static_cast<int64_t>(std::max(cache, 0L)));
}

constexpr int kBandwidthPasses = 5;

// One device's read bandwidth: alone with o.threads threads, and, where
// this rank may run on more cores, the share of one device when all of them
// read at once (the bus is shared: on many machines a few cores saturate
// it) — the smaller.
double device_bandwidth(const CalibrateOptions& o, int64_t bytes) {
  double alone;
  {
    ThreadsScope threads(o.threads);
    alone = measure_read_bandwidth(bytes, kBandwidthPasses);
  }
  const int cores = own_cores();
  if (cores <= o.threads) return alone;
  ThreadsScope threads(cores);
  const double shared = measure_read_bandwidth(bytes, kBandwidthPasses) * o.threads / cores;
  return std::min(alone, shared);
}

// With several ranks (each bound to its cores by mpirun), the bandwidth of
// every rank reading at once, summed: the memory bus they share. Collective.
double bandwidth_together(comm::Communicator& world, const CalibrateOptions& o) {
  const int64_t bytes = o.bandwidth_bytes > 0 ? o.bandwidth_bytes : default_bandwidth_bytes();
  ThreadsScope threads(o.threads);
  world.barrier()->wait();
  auto mine = static_cast<float>(measure_read_bandwidth(bytes / world.size(), kBandwidthPasses));
  world.all_reduce(Tensor(&mine, DType::f32, {1}), comm::ReduceOp::sum)->wait();  // 7 digits: plenty for a rate
  return mine;
}

// ---- the link: ping-pong between ranks 0 and 1 ---------------------------

// 8 B, 32 B, ... (x 4) up to max_bytes, which is always the last size.
std::vector<int64_t> message_sizes(int64_t max_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t n = 8; n < max_bytes; n *= 4) sizes.push_back(n);
  sizes.push_back(max_bytes);
  return sizes;
}

// Round trips per size: ~256 MiB each way in all, 3 to 30 of them.
int64_t round_trips(int64_t bytes) { return std::clamp<int64_t>((int64_t{256} << 20) / bytes, 3, 30); }

// One round trip of msg between ranks 0 and 1 (rank 0 sends first).
void round_trip(comm::Communicator& world, const Tensor& msg) {
  const int peer = 1 - world.rank();
  if (world.rank() == 0) {
    world.send(msg, peer)->wait();
    world.recv(msg, peer)->wait();
  } else {
    world.recv(msg, peer)->wait();
    world.send(msg, peer)->wait();
  }
}

// On ranks 0 and 1: per size, one untimed round trip, then the best of
// round_trips(n) halved is its one-way time; rank 0 fits them (fit_link).
// Other ranks take no part and return {}.
Link measure_link(comm::Communicator& world, const CalibrateOptions& o) {
  if (world.rank() > 1) return {};
  Pools pools;
  OwnedTensor buffer = pools[MemTag::comm].zeros(DType::i64, {o.max_message_bytes / 8});
  std::vector<double> bytes, seconds;
  for (int64_t n : message_sizes(o.max_message_bytes)) {
    const Tensor msg(buffer.data(), DType::i64, {n / 8});
    round_trip(world, msg);
    double best = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < round_trips(n); ++i) {
      const Clock::time_point t0 = Clock::now();
      round_trip(world, msg);
      best = std::min(best, seconds_since(t0));
    }
    bytes.push_back(static_cast<double>(n));
    seconds.push_back(best / 2);
  }
  return world.rank() == 0 ? fit_link(bytes, seconds) : Link{};
}

// Every rank: per size, one untimed all-reduce (f32, averaged, as data
// parallelism reduces gradients), then the best of round_trips(n) of
// barrier + all-reduce; rank 0 fits its times as a ring's 2 (n - 1) steps
// of bytes / n each (time_plan.cpp ring), so the fit is one step's latency
// and bandwidth. Rank 0's figures; the others return {}.
Link measure_collective(comm::Communicator& world, const CalibrateOptions& o) {
  const int n = world.size();
  Pools pools;
  OwnedTensor buffer = pools[MemTag::comm].zeros(DType::f32, {o.max_message_bytes / 4});
  std::vector<double> bytes, seconds;
  for (int64_t size : message_sizes(o.max_message_bytes)) {
    const Tensor buf(buffer.data(), DType::f32, {std::max<int64_t>(1, size / 4)});
    world.all_reduce(buf, comm::ReduceOp::avg)->wait();
    double best = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < round_trips(size); ++i) {
      world.barrier()->wait();
      const Clock::time_point t0 = Clock::now();
      world.all_reduce(buf, comm::ReduceOp::avg)->wait();
      best = std::min(best, seconds_since(t0));
    }
    bytes.push_back(static_cast<double>(buf.numel() * 4) / n);
    seconds.push_back(best / (2.0 * (n - 1)));
  }
  if (world.rank() != 0) return {};
  const Link step = fit_link(bytes, seconds);
  return {.bandwidth = 0, .latency = 0, .collective_bandwidth = step.bandwidth, .collective_latency = step.latency};
}

// One 8-byte message to itself through the communicator (its recv posted
// first), the best of 100: what a message costs with no peer to reach.
double self_message_seconds(comm::Communicator& world) {
  int64_t out = 1, in = 0;
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 101; ++i) {
    const Clock::time_point t0 = Clock::now();
    comm::WorkPtr recv = world.recv(Tensor(&in, DType::i64, {1}), world.rank());
    world.send(Tensor(&out, DType::i64, {1}), world.rank())->wait();
    recv->wait();
    if (i > 0) best = std::min(best, seconds_since(t0));  // the first is a warm-up
  }
  return best;
}

// ---- rank 0's figures to every rank --------------------------------------

void broadcast_words(comm::Communicator& world, std::vector<int64_t>& words) {
  world.broadcast(Tensor(words.data(), DType::i64, {static_cast<int64_t>(words.size())}), 0)->wait();
}

// Doubles travel as their bits (the communicator moves no f64).
void broadcast_doubles(comm::Communicator& world, std::vector<double>& values) {
  std::vector<int64_t> words;
  for (double v : values) words.push_back(std::bit_cast<int64_t>(v));
  broadcast_words(world, words);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::bit_cast<double>(words[i]);
}

void broadcast_string(comm::Communicator& world, std::string& s) {
  std::vector<int64_t> size{static_cast<int64_t>(s.size())};
  broadcast_words(world, size);
  std::vector<int64_t> words(static_cast<size_t>((size[0] + 7) / 8) + 1, 0);
  std::memcpy(words.data(), s.data(), s.size());  // rank 0's bytes; the others' are overwritten
  broadcast_words(world, words);
  s.assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(size[0]));
}

// ---- the figures -----------------------------------------------------------

// What rank 0 measured, in the order it is broadcast.
struct Measured {
  double fp32 = 0, bf16 = 0;  // GEMM FLOP/s; bf16 0: no native bf16 GEMM here
  double bandwidth = 0;       // bytes/s per device
  Link link;
  double devices_per_node = 0, memory_bytes = 0;

  std::vector<double> values() const {
    return {fp32,           bf16,         bandwidth, link.bandwidth, link.latency, link.collective_bandwidth,
            link.collective_latency, devices_per_node, memory_bytes};
  }
  static Measured of(const std::vector<double>& v) {
    return {v[0], v[1], v[2], {v[3], v[4], v[5], v[6]}, v[7], v[8]};
  }
};
constexpr size_t kMeasuredValues = 9;

// The first "model name" of /proc/cpuinfo.
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    if (first != std::string::npos) return line.substr(first);
  }
  return "an unnamed CPU";
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// "64 MiB", "1.17 GiB".
std::string binary_bytes(double bytes) {
  char buf[32];
  if (bytes >= double(int64_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / double(int64_t{1} << 30));
  else std::snprintf(buf, sizeof buf, "%.3g MiB", bytes / double(int64_t{1} << 20));
  return buf;
}

// Rank 0's device: compute, memory and (with one rank) the link estimate.
Measured measure_device(comm::Communicator& world, const CalibrateOptions& o, const Link& link, int devices,
                        int64_t host_memory) {
  Measured m;
  {
    ThreadsScope threads(o.threads);
    m.fp32 = achieved_gemm_flops(DType::f32, o);
    if (kernels::bf16_matmul_unsupported_reason().empty()) m.bf16 = achieved_gemm_flops(DType::bf16, o);
  }
  m.bandwidth = device_bandwidth(o, o.bandwidth_bytes > 0 ? o.bandwidth_bytes : default_bandwidth_bytes());
  m.link = world.size() >= 2 ? link : Link{.bandwidth = m.bandwidth / 2, .latency = self_message_seconds(world)};
  m.devices_per_node = devices;
  m.memory_bytes = static_cast<double>(host_memory) / devices;
  return m;
}

// The sentence Cluster::source carries: what was measured, with what, when.
std::string describe(comm::Communicator& world, const CalibrateOptions& o, int cores) {
  const int64_t stream = o.bandwidth_bytes > 0 ? o.bandwidth_bytes : default_bandwidth_bytes();
  std::string s = concat("measured by loom plan --calibrate on ", utc_date(), " (UTC) with ", world.size(),
                         " rank(s), ", o.threads, " thread(s) per device: ", std::max(1, cores / o.threads),
                         " device(s) (the cores the job may run on over the threads), each with the host's memory "
                         "over them; GEMM FLOP/s: loom's matmul (oneDNN), ",
                         o.gemm_counts.empty() ? concat("the median over ", o.gemm_shapes.size(), " shape(s) of each one's best run")
                                               : concat("the FLOPs over the time of ", o.gemm_source, " (",
                                                        o.gemm_shapes.size(), " distinct shapes, each its best run)"),
                         "; peak = achieved (no data-sheet figure for a CPU here); "
                         "memory bandwidth: the best streaming read of ", binary_bytes(double(stream)),
                         " by one device");
  if (own_cores() > o.threads)
    s += concat(", or its share when all ", own_cores(), " cores read at once if less");
  else if (cores > o.threads)
    s += concat(", or its share when every rank reads at once (", cores, " cores) if less");
  if (world.size() >= 2)
    return s + concat("; intra link: a least-squares fit of latency + bytes / bandwidth to a send/recv ping-pong "
                      "between ranks 0 and 1, 8 B to ", binary_bytes(double(o.max_message_bytes)),
                      "; its collective figures the same fit to one step of a ring all-reduce (an f32 average ",
                      "over all ", world.size(), " ranks, 8 B to ", binary_bytes(double(o.max_message_bytes)),
                      ", its time over 2 (n - 1) steps of bytes / n); inter = intra (one node)");
  return s + "; intra link estimated, not measured (one rank: no peer): bandwidth = memory bandwidth / 2 "
             "(a copy reads and writes), latency = one 8-byte send to itself; `mpirun -np 2 loom plan "
             "--calibrate` measures it; inter = intra (one node)";
}

Cluster cluster_of(const Measured& m, std::string name, std::string source) {
  Cluster c;
  c.name = std::move(name);
  c.nodes = 1;
  c.devices_per_node = static_cast<int>(m.devices_per_node);
  c.memory_bytes = m.memory_bytes;
  c.memory_bandwidth = m.bandwidth;
  c.achieved_flops["fp32"] = m.fp32;
  if (m.bf16 > 0) c.achieved_flops["bf16"] = m.bf16;
  c.peak_flops = c.achieved_flops;
  c.intra = c.inter = m.link;
  c.shared_cores = true;  // a device is a core (or `threads` of them) the node's ranks share
  c.source = std::move(source);
  return c;
}

}  // namespace

ModelGemms model_gemm_shapes(const model::ModelConfig& cfg, int64_t tokens) {
  LOOM_REQUIRE(tokens >= 1, "model_gemm_shapes: tokens must be at least 1, got ", tokens);
  ModelGemms out;
  const auto add = [&](GemmShape s, double count) {
    s.m = std::max<int64_t>(1, s.m);
    for (size_t i = 0; i < out.shapes.size(); ++i)
      if (out.shapes[i] == s) return (void)(out.counts[i] += count);
    out.shapes.push_back(s), out.counts.push_back(count);
  };
  for (const model::ParamSpec& p : model::param_specs(cfg)) {
    if (p.shape.ndim() != 2) continue;
    const int64_t rows = p.shape[0], cols = p.shape[1];
    if (model::param_part(cfg, p.name) == model::ParamPart::embedding) {  // a lookup
      if (cfg.tie_embeddings && rows == cfg.vocab_size) add({tokens, rows, cols}, 1);  // also the head's matmul
      continue;
    }
    const int64_t m = model::is_expert_param(p.name) ? tokens * cfg.top_k / cfg.n_expert : tokens;
    add({m, rows, cols}, 1);
  }
  return out;
}

std::vector<GemmShape> training_gemm_shapes() {
  return {{2048, 768, 768}, {2048, 3072, 768}, {2048, 768, 3072}, {1024, 1024, 1024}};
}

Link fit_link(std::span<const double> bytes, std::span<const double> seconds) {
  LOOM_REQUIRE(bytes.size() == seconds.size() && bytes.size() >= 2, "fit_link: needs as many times as sizes, ",
               "at least 2; got ", bytes.size(), " sizes and ", seconds.size(), " times");
  // Minimise sum w (a + g x - t)^2, w = 1 / t^2; latency a, g = 1 / bandwidth.
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    LOOM_REQUIRE(seconds[i] > 0 && bytes[i] >= 0, "fit_link: a time must be positive and a size non-negative, got ",
                 seconds[i], " s for ", bytes[i], " bytes");
    const double w = 1 / (seconds[i] * seconds[i]), x = bytes[i], t = seconds[i];
    s += w, sx += w * x, sxx += w * x * x, st += w * t, sxt += w * x * t;
  }
  const double det = s * sxx - sx * sx;
  LOOM_REQUIRE(det > 0, "fit_link: needs at least 2 distinct message sizes");
  double a = (st * sxx - sx * sxt) / det, g = (s * sxt - sx * st) / det;
  if (a < 0) a = 0, g = sxt / sxx;
  LOOM_REQUIRE(g > 0, "fit_link: the times do not grow with the message size (", seconds.front(), " s for ",
               bytes.front(), " bytes, ", seconds.back(), " s for ", bytes.back(),
               "): too noisy to fit a bandwidth; measure larger messages");
  return {.bandwidth = 1 / g, .latency = a};
}

Cluster calibrate(comm::Communicator& world, const CalibrateOptions& o) {
  check_options(o);
  const int64_t host_memory = model::host_memory_bytes();
  LOOM_REQUIRE(host_memory != std::numeric_limits<int64_t>::max(),
               "calibrate: this system does not say how much physical memory it has");
  const int cores = job_cores(world);
  Link link = world.size() >= 2 ? measure_link(world, o) : Link{};
  if (world.size() >= 2) {
    const Link ring = measure_collective(world, o);
    link.collective_bandwidth = ring.collective_bandwidth, link.collective_latency = ring.collective_latency;
  }
  const double together = world.size() >= 2 ? bandwidth_together(world, o) : 0;
  std::vector<double> values(kMeasuredValues, 0);
  std::string name, source;
  if (world.rank() == 0) {
    Measured m = measure_device(world, o, link, std::max(1, cores / o.threads), host_memory);
    if (together > 0) m.bandwidth = std::min(m.bandwidth, together * o.threads / cores);
    values = m.values();
    name = "this machine: " + cpu_model_name();
    source = describe(world, o, cores);
  }
  broadcast_doubles(world, values);
  broadcast_string(world, name);
  broadcast_string(world, source);
  return cluster_of(Measured::of(values), std::move(name), std::move(source));
}

}  // namespace loom::plan
