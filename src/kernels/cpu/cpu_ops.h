// The CPU backend: every op of the backend table (kernels/backend.h), with
// the signature and meaning ops.h gives it, for operands ops.h has checked.
// Implemented in src/kernels/cpu/*.cpp; the table itself in backend.cpp here.
//
// Calling these directly skips the checks: only the dispatch layer and
// tests/kernels/test_backend_ops.cpp (which compares them with the dispatched
// ops) do.
#pragma once

#include "kernels/backend.h"

namespace loom::kernels::cpu {

#define LOOM_KERNEL_OP_DECLARE(op, ret, params) ret op params;
LOOM_KERNEL_OPS(LOOM_KERNEL_OP_DECLARE)
#undef LOOM_KERNEL_OP_DECLARE

// The CPU backend's table: every entry is the function above of its name.
extern const Backend kBackend;

}  // namespace loom::kernels::cpu
