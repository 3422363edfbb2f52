// `loom plan --calibrate`'s measurements: the Cluster (plan/cluster.h) of
// the machine this runs on, every figure measured here and now, none taken
// from a table. On a CPU a "device" is `threads` cores running one rank
// (one core by default, as a CPU training run puts one rank on each core).
//
//   achieved_flops  loom's own GEMM (kernels::matmul, oneDNN) at
//                   training-like shapes, fp32 always and bf16 where the CPU
//                   has a native bf16 GEMM; per shape the best of repeated
//                   runs, the figure the median over the shapes — or, for a
//                   model's own GEMMs (model_gemm_shapes, `--calibrate
//                   --config RUN.toml`), their FLOPs over their time.
//   peak_flops      = achieved_flops: a CPU has no data-sheet figure here.
//   memory_bandwidth  a streaming read of a buffer far bigger than the
//                   last-level cache (core/bandwidth.h), by one device alone;
//                   where rank 0 may run on more cores, also by all of
//                   them at once, divided among their devices (the memory
//                   bus is shared) — the smaller of the two; with several
//                   ranks (each bound to its core by mpirun) also every rank
//                   reading at once, their sum divided among the devices.
//   memory_bytes, devices_per_node  the host's physical memory over the
//                   devices; the devices are the cores the job's ranks may
//                   run on (the union of their affinity masks: mpirun binds
//                   each of 2 ranks to one core) over `threads`. nodes = 1.
//   intra           with 2 or more ranks, a ping-pong of send/recv between
//                   ranks 0 and 1 from 8 B to max_message_bytes, fitted to
//                   latency + n / bandwidth (fit_link). With one rank there
//                   is no peer: estimated (bandwidth = memory bandwidth / 2,
//                   a copy reads and writes; latency = one 8-byte send to
//                   itself through the communicator), and `source` says so.
//                   Its collective figures: every rank all-reduces (f32,
//                   averaged, as data parallelism does) 8 B to
//                   max_message_bytes; rank 0's best times, taken as a
//                   ring's 2 (n - 1) steps of bytes / n, fitted the same way.
//                   With one rank: none (a ring step is a message).
//   inter           = intra (one node: nothing crosses nodes).
//
// Rank 0 measures the device while the other ranks wait in a broadcast of
// its figures, so every rank returns the same Cluster; the broadcast's wait
// is bounded by the communicator's timeout_s (default 300 s), which the
// default measurement (seconds, not minutes) stays far inside.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "plan/cluster.h"

namespace loom::plan {

// c (M, N) = a (M, K) @ b (N, K)^T: a linear layer's forward of M tokens.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  friend bool operator==(const GemmShape&, const GemmShape&) = default;
};

// The default shapes: 2048 tokens through GPT-2 small's linears (768 -> 768,
// 768 -> 3072, 3072 -> 768) and a square 1024^3.
std::vector<GemmShape> training_gemm_shapes();

// A model's own forward GEMMs for `tokens` tokens (one micro-batch of one
// rank, no tensor parallelism), each distinct shape once with how many
// times a forward runs it: every 2-D weight of param_specs but the position
// table and an untied embedding (lookups), the tied embedding once more as
// the head; an expert's rows are tokens x top_k / n_expert. A config the
// model rejects is a loom::Error.
struct ModelGemms {
  std::vector<GemmShape> shapes;
  std::vector<double> counts;
};
ModelGemms model_gemm_shapes(const model::ModelConfig& cfg, int64_t tokens);

struct CalibrateOptions {
  int threads = 1;                    // OpenMP threads of one device (a rank)
  double seconds_per_measure = 0.3;   // each GEMM shape repeats at least this long (and at least 3 times)
  std::vector<GemmShape> gemm_shapes = training_gemm_shapes();
  // Empty: the figure is the median of the shapes' rates. Else, per shape,
  // how often a step runs it (model_gemm_shapes): the figure is their FLOPs
  // over their time, the rate that times that model's GEMMs together.
  std::vector<double> gemm_counts;
  std::string gemm_source;  // what the shapes are, for Cluster::source ("" : the default shapes)
  int64_t bandwidth_bytes = 0;        // the streamed buffer; 0: max(512 MiB, 4 x the last-level cache)
  int64_t max_message_bytes = int64_t{64} << 20;  // the ping-pong's largest message (>= 1 MiB)
};

// Measures this machine (above). Collective over `world`: every rank calls
// it, and every rank returns the same figures. Bad options are a
// loom::Error.
Cluster calibrate(comm::Communicator& world, const CalibrateOptions& o = {});

// The alpha-beta link through one-way times `seconds[i]` of messages of
// `bytes[i]`: least squares of latency + bytes / bandwidth, each point
// weighted by 1 / seconds^2 (its relative error counts), so the small
// messages set the latency and the large ones the bandwidth without the
// large ones' absolute times swamping the small. A negative latency fit is
// refitted with latency 0. Needs 2 or more distinct sizes.
Link fit_link(std::span<const double> bytes, std::span<const double> seconds);

}  // namespace loom::plan
