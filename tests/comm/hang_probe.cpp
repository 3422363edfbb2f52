// A job with a hung rank, for the watchdog test (watchdog_test.sh):
//   hang_probe TIMEOUT_S SLEEP_RANK SLEEP_S [marker]
// Every rank runs one all_reduce on a communicator named "probe"; then
// SLEEP_RANK sleeps SLEEP_S seconds before the second all_reduce while the
// others wait on it with a deadline of TIMEOUT_S. Rank 0 prints the time it
// starts waiting, so the driver can measure how long the abort took.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/mpi_backend.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: hang_probe TIMEOUT_S SLEEP_RANK SLEEP_S [marker]\n");
    return 2;
  }
  loom::comm::Options opts;
  opts.timeout_s = std::atof(argv[1]);
  const int sleep_rank = std::atoi(argv[2]);
  const int sleep_s = std::atoi(argv[3]);
  auto world = loom::comm::mpi_world(opts);
  auto probe = world->split(0, world->rank(), "probe");
  std::vector<float> buf(4, 1.0f);
  loom::Tensor t(buf.data(), loom::DType::f32, {4});
  probe->all_reduce(t, loom::comm::ReduceOp::sum)->wait();
  if (probe->rank() == sleep_rank) std::this_thread::sleep_for(std::chrono::seconds(sleep_s));
  if (probe->rank() == 0) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::printf("probe: rank 0 waits on the second all_reduce at %.3f\n", now);
    std::fflush(stdout);
  }
  probe->all_reduce(t, loom::comm::ReduceOp::sum)->wait();
  std::printf("probe: rank %d finished\n", probe->rank());
  probe.reset();
  world.reset();
  return 0;
}
