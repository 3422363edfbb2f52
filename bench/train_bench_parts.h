// The pieces `loom bench train`'s runs share (train_bench.cpp: data
// parallel and tp; train_bench_pp.cpp: pp; cp_bench.cpp: context parallel): random tokens, the
// trainer's step, the MPI job, reductions of timings over ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/train_bench.h"
#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/model.h"
#include "parallel/dp.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/rank_chunks.h"

namespace loom::bench {

inline constexpr double kLr = 3e-4, kGradClip = 1.0;  // values do not change the work done
inline constexpr uint64_t kSeed = 1;

struct StepTimes {
  double median = 0, best = 0;
};

// Uniform tokens in [0, vocab) from a fixed xorshift stream.
void fill_tokens(Tensor t, int64_t vocab, uint64_t seed);
// The process's peak resident set so far (Linux: ru_maxrss in KiB).
size_t max_rss_bytes();
// One training step as train::Trainer::step does it, with grad_accum = 1;
// scaler: fp16's dynamic loss scaling, else null.
void train_step(model::Model& m, parallel::DataParallel& dp, train::AdamW& adamw, const Tensor& tokens,
                const Tensor& targets, train::DynamicLossScaler* scaler);
// Under mpirun, main() has initialised MPI before any command runs (it holds
// the job's world while the command runs); a plain process never touches MPI.
bool in_mpi_job();
// Element-wise maximum over the ranks of `comm`, exchanged as f32 (comm has
// no f64): 7 digits are plenty for seconds.
void max_over_ranks(comm::Communicator& comm, std::vector<double>& values);
double median_of(std::vector<double> v);
// The chunks' options of a run (train/rank_chunks.h).
train::ChunkOptions chunk_options(const TrainBenchOptions& o, const model::ModelConfig& cfg, DType compute);

// `loom bench train --pp N` (train_bench_pp.cpp), under mpirun.
int run_pp_bench(const TrainBenchOptions& o, comm::Communicator& world);
// `loom bench train --cp N` (cp_bench.cpp), under mpirun.
int run_cp_bench(const TrainBenchOptions& o, comm::Communicator& world);
// `loom bench train --moe E [--ep N]` (moe_bench.cpp).
int run_moe_bench(const TrainBenchOptions& o, comm::Communicator& world);

}  // namespace loom::bench
