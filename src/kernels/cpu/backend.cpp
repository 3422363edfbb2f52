// The CPU backend's table (cpu_ops.h), built in: the registry
// (kernels/backend.cpp) starts with it.
#include "kernels/cpu/cpu_ops.h"

namespace loom::kernels::cpu {
namespace {

// Every entry filled from the one op list, so none can be missed.
constexpr Backend make_backend() {
  Backend b;
  b.name = "cpu";
  b.kind = Device::Kind::cpu;
#define LOOM_KERNEL_OP_FILL(op, ret, params) b.op = &cpu::op;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_FILL)
#undef LOOM_KERNEL_OP_FILL
  return b;
}

}  // namespace

constinit const Backend kBackend = make_backend();

}  // namespace loom::kernels::cpu
