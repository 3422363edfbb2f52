// For multi-rank tests (tests/<module>/mpi_test_<name>.cpp, run by
// tests/mpi.cmake under mpirun at several world sizes).
#pragma once

#include "comm/communicator.h"

namespace loom::test {

// The world communicator (default Options but timeout_s = 60, below ctest's
// TIMEOUT), created (and MPI initialised)
// by the test main before any test runs.
comm::Communicator& world();

}  // namespace loom::test
