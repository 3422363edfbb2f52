// Helpers shared by the multi-rank tests (tests/<module>/mpi_test_<name>.cpp):
// a directory every rank of the world sees, rank 0's values on every rank,
// and work done by rank 0 alone while the others wait. Each is collective
// over the world (common/mpi_env.h).
//
//   const fs::path dir = shared_temp_dir("loom_mpi_x");  // the same path on every rank
//   on_rank_zero([&] { write_files(dir); });            // then every rank sees them
//   const std::vector<double> ref = rank_zero_values(n, [&] { return run_alone(); });
//   remove_shared_dir(dir);
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "common/mpi_env.h"
#include "core/tensor.h"

namespace loom::test {

// /tmp/<prefix>_<rank 0's pid>: rank 0 names it (a pid is unique among the
// running jobs, so concurrent test runs do not collide) and broadcasts the
// name. Collective over the world.
inline std::filesystem::path shared_temp_dir(const std::string& prefix) {
  comm::Communicator& w = world();
  int64_t pid = w.rank() == 0 ? static_cast<int64_t>(::getpid()) : 0;
  w.broadcast(Tensor(&pid, DType::i64, {1}), 0)->wait();
  return std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(pid));
}

// Removes a shared dir once every rank is done with it. Collective.
inline void remove_shared_dir(const std::filesystem::path& dir) {
  world().barrier()->wait();
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// rank 0's values on every rank of w (n values everywhere). Collective.
inline std::vector<double> broadcast_values(comm::Communicator& w, std::vector<double> values, size_t n) {
  values.resize(n);
  static_assert(sizeof(double) == sizeof(int64_t));
  w.broadcast(Tensor(values.data(), DType::i64, {static_cast<int64_t>(n)}), 0)->wait();
  return values;
}

// fn() (n doubles) computed by rank 0 of the world alone, on every rank:
// a reference run that one process makes for all. Collective.
template <typename Fn>
std::vector<double> rank_zero_values(size_t n, Fn&& fn) {
  std::vector<double> values;
  if (world().rank() == 0) values = std::forward<Fn>(fn)();
  return broadcast_values(world(), std::move(values), n);
}

// fn() run by rank 0 of the world alone (e.g. writing or damaging a shared
// file); once it returns on every rank, every rank sees what it did.
// Collective.
template <typename Fn>
void on_rank_zero(Fn&& fn) {
  if (world().rank() == 0) std::forward<Fn>(fn)();
  world().barrier()->wait();
}

// Rank 0 prints "[tag N=n] what: max relative loss difference d".
inline void report_difference(const char* tag, const std::string& what, double diff) {
  if (world().rank() != 0) return;
  std::printf("[%s N=%d] %s: max relative loss difference %.3g\n", tag, world().size(), what.c_str(), diff);
  std::fflush(stdout);
}

// max_i |a_i - b_i| / |b_i|; +inf if the sizes differ, NaN if any term is.
inline double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]) / std::abs(b[i]);
    if (!(d <= worst)) worst = d;  // a NaN wins, so that it fails the caller's bound
  }
  return worst;
}

}  // namespace loom::test
