// One level's CPU backend table (cpu_ops.h) and its entry point, the only
// global symbol of the level's object (src/kernels/CMakeLists.txt):
// loom_cpu_backend_avx2 and so on (and loom_cpu_backend_amx beside
// avx512_bf16's), called by kernels/cpu_isa.cpp.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/linear_amx.h"

#define LOOM_CONCAT2(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT2(a, b)
#define LOOM_STRING2(a) #a
#define LOOM_STRING(a) LOOM_STRING2(a)

namespace loom::kernels::cpu::LOOM_ISA {
namespace {

// Every entry filled from the one op list, so none can be missed. Named
// "cpu" whatever the level: messages name the device, and the level is
// logged once at start-up (cpu_isa.h).
constexpr Backend make_backend() {
  Backend b;
  b.name = "cpu";
  b.kind = Device::Kind::cpu;
#define LOOM_KERNEL_OP_FILL(op, ret, params) b.op = &LOOM_ISA::op;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_FILL)
#undef LOOM_KERNEL_OP_FILL
  return b;
}

constinit const Backend kBackend = make_backend();

#if defined(__AVX512BF16__)
// The amx level: this level's kernels, but bf16 serving linears and the
// integer sums of q8_0 / q4_0 ones in AMX tiles.
constexpr Backend make_amx_backend() {
  Backend b = make_backend();
  b.linear_forward_invariant = &linear_forward_invariant_amx;
  b.linear_forward_quantized = &linear_forward_quantized_amx;
  return b;
}
constinit const Backend kAmxBackend = make_amx_backend();
#endif

}  // namespace
}  // namespace loom::kernels::cpu::LOOM_ISA

extern "C" const loom::kernels::Backend* LOOM_CONCAT(loom_cpu_backend_, LOOM_ISA)() {
  return &loom::kernels::cpu::LOOM_ISA::kBackend;
}

#if defined(__AVX512BF16__)
// Kept global in the avx512_bf16 object only (src/kernels/CMakeLists.txt).
extern "C" const loom::kernels::Backend* loom_cpu_backend_amx() { return &loom::kernels::cpu::LOOM_ISA::kAmxBackend; }
#endif
