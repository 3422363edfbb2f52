// `loom bench ps-transport` (bench/ps_transport.h).
#include "bench/ps_transport.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "comm/reduce.h"
#include "core/error.h"

namespace loom::bench {
namespace {

// The server's sum of the workers' slots (n each), in worker order.
void sum_slots(const std::vector<float>& slots, std::vector<float>& sum, int64_t n, int workers) {
  std::copy(slots.begin(), slots.begin() + n, sum.begin());
  for (int w = 1; w < workers; ++w) comm::reduce_into(sum.data(), slots.data() + w * n, n, DType::f32, comm::ReduceOp::sum);
}

// One round over point-to-point messages.
void p2p_round(std::vector<float>& grad, std::vector<float>& slots, std::vector<float>& sum, int64_t n) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int count = static_cast<int>(n);
  if (rank != 0) {
    MPI_Send(grad.data(), count, MPI_FLOAT, 0, 1, MPI_COMM_WORLD);
    MPI_Recv(sum.data(), count, MPI_FLOAT, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return;
  }
  std::vector<MPI_Request> reqs(static_cast<size_t>(size - 1));
  for (int w = 1; w < size; ++w)
    MPI_Irecv(slots.data() + (w - 1) * n, count, MPI_FLOAT, w, 1, MPI_COMM_WORLD, &reqs[static_cast<size_t>(w - 1)]);
  MPI_Waitall(size - 1, reqs.data(), MPI_STATUSES_IGNORE);
  sum_slots(slots, sum, n, size - 1);
  for (int w = 1; w < size; ++w)
    MPI_Isend(sum.data(), count, MPI_FLOAT, w, 2, MPI_COMM_WORLD, &reqs[static_cast<size_t>(w - 1)]);
  MPI_Waitall(size - 1, reqs.data(), MPI_STATUSES_IGNORE);
}

// One round over one-sided communication: the windows expose the server's
// slots and its sum (workers expose nothing).
void rma_round(MPI_Win slots_win, MPI_Win sum_win, std::vector<float>& grad, std::vector<float>& slots,
               std::vector<float>& sum, int64_t n) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int count = static_cast<int>(n);
  MPI_Win_fence(0, slots_win);
  if (rank != 0) MPI_Put(grad.data(), count, MPI_FLOAT, 0, (rank - 1) * n, count, MPI_FLOAT, slots_win);
  MPI_Win_fence(0, slots_win);
  if (rank == 0) sum_slots(slots, sum, n, size - 1);
  MPI_Win_fence(0, sum_win);
  if (rank != 0) MPI_Get(sum.data(), count, MPI_FLOAT, 0, 0, count, MPI_FLOAT, sum_win);
  MPI_Win_fence(0, sum_win);
}

template <typename Round>
double median_seconds(int iters, Round round) {
  round();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    round();
    double took = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t.push_back(slowest);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int run_ps_transport_bench(const PsTransportOptions& o) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  LOOM_REQUIRE(size >= 2, "loom bench ps-transport needs a server and at least one worker: mpirun -np 2 or more");
  LOOM_REQUIRE(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes && o.max_bytes <= (int64_t{1} << 30) && o.iters >= 1,
               "loom bench ps-transport: --min ", o.min_bytes, ", --max ", o.max_bytes, ", --iters ", o.iters,
               ": allowed 4 <= min <= max <= 1G bytes, iters >= 1");
  const int workers = size - 1;
  if (rank == 0) {
    std::printf("# %s\n# 1 server, %d worker%s; a round: every worker pushes n f32 and pulls their sum back\n",
                o.command.c_str(), workers, workers == 1 ? "" : "s");
    std::printf("%12s %14s %14s %12s %12s %8s\n", "bytes", "p2p s/round", "rma s/round", "p2p GB/s", "rma GB/s",
                "rma/p2p");
  }
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int64_t n = bytes / 4;
    std::vector<float> grad(static_cast<size_t>(n), 1.0f + static_cast<float>(rank)), sum(static_cast<size_t>(n));
    std::vector<float> slots(rank == 0 ? static_cast<size_t>(workers * n) : 0);
    MPI_Win slots_win, sum_win;
    MPI_Win_create(slots.data(), static_cast<MPI_Aint>(slots.size() * sizeof(float)), sizeof(float), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &slots_win);
    MPI_Win_create(rank == 0 ? sum.data() : nullptr, rank == 0 ? static_cast<MPI_Aint>(n * 4) : 0, sizeof(float),
                   MPI_INFO_NULL, MPI_COMM_WORLD, &sum_win);
    const double p2p = median_seconds(o.iters, [&] { p2p_round(grad, slots, sum, n); });
    const float want = static_cast<float>(workers * (workers + 3)) / 2.0f;  // sum over w of 1 + w
    const bool p2p_ok = sum[0] == want && sum[static_cast<size_t>(n - 1)] == want;
    const double rma = median_seconds(o.iters, [&] { rma_round(slots_win, sum_win, grad, slots, sum, n); });
    const bool rma_ok = sum[0] == want && sum[static_cast<size_t>(n - 1)] == want;
    MPI_Win_free(&slots_win);
    MPI_Win_free(&sum_win);
    int ok = p2p_ok && rma_ok ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    LOOM_REQUIRE(all_ok == 1, "loom bench ps-transport: a pulled sum differs from the expected ", want);
    if (rank == 0)
      std::printf("%12lld %14.6f %14.6f %12.3f %12.3f %8.2f\n", static_cast<long long>(bytes), p2p, rma,
                  2.0 * static_cast<double>(bytes) / p2p / 1e9, 2.0 * static_cast<double>(bytes) / rma / 1e9,
                  rma / p2p);
  }
  return 0;
}

}  // namespace loom::bench
