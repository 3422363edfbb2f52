// linear_forward_quantized's path for many rows (quant_prefill.cpp), called
// by quant_linear.cpp. Internal to src/kernels/cpu; compiled per
// instruction-set level like cpu_ops.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant.h"

#ifndef LOOM_ISA
#error "kernels/cpu/quant_prefill.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

// One call's operands as blocks: y (N, OC) f32; a, x's rows quantized to the
// weight type's dot type, a_row bytes apart; w, W's rows, w_row bytes apart;
// bias (OC) or null; nb blocks a row.
struct QuantOperands {
  float* y;
  const std::byte* a;
  const std::byte* w;
  const float* bias;
  size_t a_row, w_row;
  int64_t N, OC, nb;
};

// All of y, with the scalar reference's bits (quant.h's vec_dot, then +
// bias), for q8_0, q4_0, q5_0, q4_1, q5_1, q2_K, q3_K, q4_K, q5_K and q6_K
// weights and at least kQuantPrefillRows rows, at levels with AVX512_VNNI;
// false (nothing written) otherwise. Levels with AVX2 but not AVX512_VNNI
// take quant_prefill8 (8 outputs a vector, the same types) from 4 rows (its
// kPackedMinRows).
inline constexpr int64_t kQuantPrefillRows = 16;
bool quant_prefill(QuantType wtype, const QuantOperands& o);
bool quant_prefill8(QuantType wtype, const QuantOperands& o);  // quant_prefill8.cpp
// The amx level's (quant_prefill_amx.cpp): q8_0 and q4_0 with the integer
// sums in AMX tiles, the other types as quant_prefill. Call only where the
// process may use AMX tiles (cpu_isa.cpp's amx level).
bool quant_prefill_amx(QuantType wtype, const QuantOperands& o);
bool quant_prefill_amx_k(QuantType wtype, const QuantOperands& o);  // q4_K, q6_K: quant_prefill_amx_k.cpp

// All of y as quant_prefill, for q8_0, q4_0, q5_0, q4_1 and q5_1 weights
// and fewer than kQuantPrefillRows rows (decode), at levels with
// AVX512_VNNI (quant_decode.cpp); false (nothing written) otherwise.
bool quant_decode16(QuantType wtype, const QuantOperands& o);

// quantize_row's bytes for the activation types q8_0 and q8_K, in vector
// form (quant_activations.cpp); false (the caller then runs quantize_row) at
// the generic level, for other types, and for rows quantize_row refuses
// or whose tiny scales it handles by its own rules.
bool quantize_row_fast(QuantType t, const float* x, void* blocks, int64_t n);

}  // namespace loom::kernels::cpu::LOOM_ISA
