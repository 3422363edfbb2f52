// The main of every multi-rank test: GoogleTest on every rank; rank 0 prints
// the usual report, other ranks print only their failures (with their rank),
// and every rank exits non-zero if any rank failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "comm/mpi_backend.h"
#include "common/isa_env.h"
#include "common/mpi_env.h"
#include "core/log.h"

namespace loom::test {
namespace {

std::unique_ptr<comm::Communicator>& world_ptr() {
  static std::unique_ptr<comm::Communicator> w;
  return w;
}

// Failures of a rank other than 0, prefixed with its rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

comm::Communicator& world() { return *world_ptr(); }

double watchdog_seconds() {
  const char* factor = std::getenv("LOOM_TEST_TIMEOUT_FACTOR");
  return 60.0 * (factor ? std::max(1.0, std::atof(factor)) : 1.0);
}

}  // namespace loom::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& world = loom::test::world_ptr();
  loom::comm::Options options;
  options.timeout_s = loom::test::watchdog_seconds();
  world = loom::comm::mpi_world(options);
  loom::set_log_rank(world->rank(), world->size());
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new loom::test::RankFailurePrinter(world->rank()));
  }
  // The same environment and CPU on every rank: all skip or none does.
  if (const int code = loom::test::apply_isa_from_env(); code != 0) {
    world.reset();
    return code;
  }
  int32_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->all_reduce(loom::Tensor(&failed, loom::DType::i32, {1}), loom::comm::ReduceOp::max)->wait();
  world.reset();  // before MPI_Finalize runs at exit
  return failed;
}
