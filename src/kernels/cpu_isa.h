// The instruction-set level the CPU kernels run at (DESIGN.md §1.9): one
// binary carries every level's kernels (src/kernels/CMakeLists.txt) and the
// level is chosen once at start-up from what the CPU and the OS support
// (CPUID and XGETBV; for AMX also the kernel's permission), capped by the
// user (`--isa`, or LOOM_ISA, read by main only).
//
// Levels, each including the ones before it:
//   generic      any x86-64: for correctness, never the path a supported CPU takes
//   avx2         AVX2 + FMA + F16C (x86-64-v3: Haswell, Zen 1-3, Intel client chips)
//   avx512       AVX-512 F/BW/VL/DQ/CD (x86-64-v4: Skylake-X, Zen 4)
//   avx512_bf16  + AVX512_BF16 and AVX512_VNNI (Cooper Lake, Sapphire Rapids, Zen 4/5)
//   amx          + AMX tiles: avx512_bf16's kernels but bf16 serving linears in
//                AMX tiles (cpu/linear_amx.cpp); oneDNN's GEMMs use AMX
// The cap also caps oneDNN (training's GEMMs) when it comes before oneDNN's
// first use, which main's does.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kernels/backend.h"

namespace loom::kernels {

enum class CpuIsa : int { generic, avx2, avx512, avx512_bf16, amx };
inline constexpr int kCpuIsaLevels = 5;

const char* cpu_isa_name(CpuIsa level);
// "generic, avx2, avx512, avx512_bf16, amx": for messages.
std::string cpu_isa_names();
// The level named s (as cpu_isa_name spells it), or nullopt.
std::optional<CpuIsa> cpu_isa_from_name(std::string_view s);
// The same, or loom::Error "<what>: 's' is not a level; allowed: ...".
CpuIsa cpu_isa_from_name_or_fail(std::string_view s, std::string_view what);

// The highest level this CPU and OS support (detected once).
CpuIsa cpu_isa_supported();
// The level of the CPU backend that ops run at now.
CpuIsa cpu_isa();

// Runs the CPU ops at min(cap, cpu_isa_supported()) from now on and returns
// that level; caps oneDNN as well if it has not been used yet. Not meant to
// race with op calls. Tests switch levels with it; main calls it once.
CpuIsa set_cpu_isa(CpuIsa cap);

// The table of one level's kernels, to call a level directly (tests that
// compare levels, benchmarks). loom::Error if the CPU lacks the level.
const Backend& cpu_backend(CpuIsa level);

// The instruction set oneDNN's GEMMs run at (its own names: "avx2",
// "avx512_core_amx", ...). Fixes oneDNN's cap: call after set_cpu_isa.
const char* onednn_isa_name();

// One line for the start-up log: "cpu kernels: avx2 (this CPU supports
// avx512_bf16; capped by --isa); oneDNN: avx2".
std::string cpu_isa_describe();

}  // namespace loom::kernels
