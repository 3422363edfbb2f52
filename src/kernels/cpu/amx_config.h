// LDTILECFG's operand and its loading, for the amx level's tile code
// (linear_amx.cpp: bf16; quant_amx.h: int8). Internal to src/kernels/cpu;
// used only where AVX512_BF16 is (the avx512_bf16 objects, whose table is
// also the amx level's), and run only at the amx level.
#pragma once

#include <cstdint>

#include <immintrin.h>

#ifndef LOOM_ISA
#error "kernels/cpu/amx_config.h is included only by the per-level CPU kernel sources"
#endif

namespace loom::kernels::cpu::LOOM_ISA {

// LDTILECFG's 64-byte operand, palette 1: each tile's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The calling thread's tiles configured as c says. GCC 12's
// _tile_loadconfig does not tell the compiler that it reads c: without the
// barrier, the stores that filled c are dropped as dead (every tile then
// unconfigured, and the first tile instruction faults).
__attribute__((target("amx-tile"))) inline void load_tile_config(const TileConfig& c) {
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

}  // namespace loom::kernels::cpu::LOOM_ISA
