// For multi-rank tests (tests/<module>/mpi_test_<name>.cpp, run by
// tests/mpi.cmake under mpirun at several world sizes).
#pragma once

#include "comm/communicator.h"

namespace loom::test {

// The world communicator (default Options but timeout_s = watchdog_seconds()),
// created (and MPI initialised) by the test main before any test runs.
comm::Communicator& world();

// 60 s, well under ctest's TIMEOUT 300 (tests/mpi.cmake): a hang ends in the
// watchdog's message naming the op, not in ctest's silent kill. Times the
// LOOM_TEST_TIMEOUT_FACTOR of the environment, which a sanitizer build sets
// with ctest's timeouts (tests/properties.cmake): sanitized code is slower.
double watchdog_seconds();

}  // namespace loom::test
