// A job with a hung rank, for the watchdog tests (watchdog_test.sh):
//   hang_probe TIMEOUT_S SLEEP_RANK SLEEP_S [marker] [wait|test|destroy|exit]
// Every rank runs one all_reduce on a communicator named "probe"; then
// SLEEP_RANK sleeps SLEEP_S seconds before the second all_reduce (exit: it
// leaves at once, destroying the probe communicator, and waits at the job's
// exit barrier as a rank of `loom` that returned from its command does)
// while the others, with a deadline of TIMEOUT_S,
//   wait:    wait() on it;
//   test:    poll test() on it (the deadline counts from the issue);
//   destroy: drop its Work and destroy the communicator (the drain's deadline);
//   exit:    wait() on it.
// Rank 0 prints the time it starts waiting, so the driver can measure how
// long the abort took.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_backend.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: hang_probe TIMEOUT_S SLEEP_RANK SLEEP_S [marker] [wait|test|destroy|exit]\n");
    return 2;
  }
  loom::comm::Options opts;
  opts.timeout_s = std::atof(argv[1]);
  const int sleep_rank = std::atoi(argv[2]);
  const int sleep_s = std::atoi(argv[3]);
  const std::string mode = argc > 5 ? argv[5] : "wait";
  auto world = loom::comm::mpi_world(opts);
  // The exit barrier's communicator, with loom main()'s year-long deadline.
  auto idle = loom::comm::mpi_world(loom::comm::Options{365.0 * 24 * 3600});
  auto probe = world->split(0, world->rank(), "probe");
  std::vector<float> buf(4, 1.0f);
  loom::Tensor t(buf.data(), loom::DType::f32, {4});
  probe->all_reduce(t, loom::comm::ReduceOp::sum)->wait();
  if (mode == "exit" && probe->rank() == sleep_rank) {
    probe.reset();
    idle->barrier()->wait();  // the others never come: their watchdog ends the job
    return 1;
  }
  if (probe->rank() == sleep_rank) std::this_thread::sleep_for(std::chrono::seconds(sleep_s));
  if (probe->rank() == 0) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::printf("probe: rank 0 waits on the second all_reduce at %.3f\n", now);
    std::fflush(stdout);
  }
  loom::comm::WorkPtr work = probe->all_reduce(t, loom::comm::ReduceOp::sum);
  if (mode == "test" && probe->rank() != sleep_rank) {
    while (!work->test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } else if (mode == "destroy" && probe->rank() != sleep_rank) {
    work.reset();
    probe.reset();  // drains the all_reduce: the watchdog must end it
  } else {
    work->wait();
  }
  std::printf("probe: rank %d finished\n", world->rank());
  probe.reset();
  idle.reset();
  world.reset();
  return 0;
}
