// The pieces `loom bench train`'s runs share (train_bench_parts.h).
#include "bench/train_bench_parts.h"

#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>

namespace loom::bench {

// Uniform tokens in [0, vocab) from a fixed xorshift stream.
void fill_tokens(Tensor t, int64_t vocab, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.data_as<int32_t>()[i] = static_cast<int32_t>((s >> 11) % static_cast<uint64_t>(vocab));
  }
}

// The process's peak resident set so far (Linux: ru_maxrss in KiB).
size_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

// One training step as train::Trainer::step does it, with grad_accum = 1;
// scaler: fp16's dynamic loss scaling, else null.
void train_step(model::Model& m, parallel::DataParallel& dp, train::AdamW& adamw, const Tensor& tokens,
                const Tensor& targets, train::DynamicLossScaler* scaler) {
  const double loss_scale = scaler ? scaler->scale() : 1.0;
  dp.zero_grads();
  dp.begin_micro_batch(true);
  const auto dloss = static_cast<float>(loss_scale);
  m.forward(tokens, targets, 0, dloss);
  m.backward(dloss);
  const double norm = dp.grad_norm() / loss_scale;
  if (scaler && !scaler->update(std::isfinite(norm))) return;
  adamw.step(kLr, static_cast<float>((norm > kGradClip ? kGradClip / norm : 1.0) / loss_scale));
}

// Under mpirun, main() has initialised MPI before any command runs (it holds
// the job's world while the command runs); a plain process never touches MPI.
bool in_mpi_job() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

// Element-wise maximum over the ranks of `comm`, exchanged as f32 (comm has
// no f64): 7 digits are plenty for seconds.
void max_over_ranks(comm::Communicator& comm, std::vector<double>& values) {
  if (comm.size() == 1 || values.empty()) return;
  std::vector<float> v(values.begin(), values.end());
  comm.all_reduce(Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}), comm::ReduceOp::max)->wait();
  values.assign(v.begin(), v.end());
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

train::ChunkOptions chunk_options(const TrainBenchOptions& o, const model::ModelConfig& cfg, DType compute) {
  train::ChunkOptions c;
  c.cp_algo = o.cp_algo, c.cp_zigzag = !o.cp_contiguous;
  c.model = cfg;
  c.micro_batch = o.batch, c.seq_len = o.seq;
  c.compute = compute;
  c.recompute = model::recompute_from_name(o.recompute);
  c.sequence_parallel = o.sequence_parallel;
  c.dp.zero_stage = o.zero_stage, c.dp.bucket_mb = o.bucket_mb;
  c.seed = kSeed;
  c.pp_schedule = o.schedule;
  c.micro_batches = o.micro_batches;
  c.virtual_stages = o.virtual_stages;
  c.pp_layers = o.pp_layers;
  return c;
}

}  // namespace loom::bench
