// Detection of the CPU's instruction-set level and the choice of the CPU
// backend's table (cpu_isa.h). A feature counts only when the CPU reports
// it (CPUID) AND the OS saves its registers on a context switch (XGETBV's
// XCR0: without that, the instructions fault); AMX's tile data also needs
// the process's permission, asked for once (Linux 5.16+, arch_prctl).
#include "kernels/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "core/error.h"
#include "kernels/dispatch.h"

// Each level's table: the entry points its localized object keeps global.
extern "C" {
const loom::kernels::Backend* loom_cpu_backend_generic();
const loom::kernels::Backend* loom_cpu_backend_avx2();
const loom::kernels::Backend* loom_cpu_backend_avx512();
const loom::kernels::Backend* loom_cpu_backend_avx512_bf16();
const loom::kernels::Backend* loom_cpu_backend_amx();
}

namespace loom::kernels {
namespace {

constexpr const char* kNames[kCpuIsaLevels] = {"generic", "avx2", "avx512", "avx512_bf16", "amx"};

bool bit(uint32_t reg, int i) { return ((reg >> i) & 1u) != 0; }

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux's permission for AMX tile data (XFEATURE_XTILEDATA = 18), asked for
// with ARCH_REQ_XCOMP_PERM (0x1023): without it the first tile load faults.
bool amx_permitted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuIsa detect() {
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return CpuIsa::generic;
  const bool fma = bit(c, 12), movbe = bit(c, 22), osxsave = bit(c, 27), avx = bit(c, 28), f16c = bit(c, 29);
  if (!(osxsave && avx)) return CpuIsa::generic;
  const uint64_t xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return CpuIsa::generic;  // SSE and AVX state
  uint32_t a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) == 0) return CpuIsa::generic;
  uint32_t ae = 0, be = 0, ce = 0, de = 0;
  __get_cpuid(0x80000001, &ae, &be, &ce, &de);
  const bool lzcnt = bit(ce, 5);
  // x86-64-v3, what the avx2 objects are compiled for (CMakeLists.txt).
  if (!(fma && movbe && f16c && bit(b7, 5) && bit(b7, 3) && bit(b7, 8) && lzcnt)) return CpuIsa::generic;
  // x86-64-v4: AVX-512 F, DQ, CD, BW, VL, and the opmask and zmm state.
  const bool avx512 = bit(b7, 16) && bit(b7, 17) && bit(b7, 28) && bit(b7, 30) && bit(b7, 31);
  if (!avx512 || (xcr & 0xe0) != 0xe0) return CpuIsa::avx2;
  uint32_t a71 = 0, b71 = 0, c71 = 0, d71 = 0;
  __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
  if (!(bit(a71, 5) && bit(c7, 11))) return CpuIsa::avx512;  // AVX512_BF16, AVX512_VNNI
  const bool amx = bit(d7, 22) && bit(d7, 24) && bit(d7, 25);  // AMX-BF16, AMX-TILE, AMX-INT8
  if (!amx || (xcr & 0x60000) != 0x60000 || !amx_permitted()) return CpuIsa::avx512_bf16;
  return CpuIsa::amx;
}

const Backend* table_of(CpuIsa kernels) {
  switch (kernels) {
    case CpuIsa::generic: return loom_cpu_backend_generic();
    case CpuIsa::avx2: return loom_cpu_backend_avx2();
    case CpuIsa::avx512: return loom_cpu_backend_avx512();
    case CpuIsa::avx512_bf16: return loom_cpu_backend_avx512_bf16();
    default: return loom_cpu_backend_amx();
  }
}

dnnl::cpu_isa onednn_cap(CpuIsa level) {
  switch (level) {
    case CpuIsa::generic: return dnnl::cpu_isa::sse41;
    case CpuIsa::avx2: return dnnl::cpu_isa::avx2;
    case CpuIsa::avx512: return dnnl::cpu_isa::avx512_core;
    case CpuIsa::avx512_bf16: return dnnl::cpu_isa::avx512_core_bf16;
    default: return dnnl::cpu_isa::all;
  }
}

const char* onednn_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

std::atomic<int> g_level{-1};        // the running level; -1 until chosen
std::atomic<bool> g_capped{false};   // set_cpu_isa chose below the supported level
std::mutex g_choose;

}  // namespace

const char* cpu_isa_name(CpuIsa level) { return kNames[static_cast<int>(level)]; }

std::string cpu_isa_names() {
  std::string s;
  for (const char* n : kNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

std::optional<CpuIsa> cpu_isa_from_name(std::string_view s) {
  for (int i = 0; i < kCpuIsaLevels; ++i)
    if (s == kNames[i]) return static_cast<CpuIsa>(i);
  return std::nullopt;
}

CpuIsa cpu_isa_from_name_or_fail(std::string_view s, std::string_view what) {
  if (const auto level = cpu_isa_from_name(s)) return *level;
  fail(what, ": '", s, "' is not a level; allowed: ", cpu_isa_names());
}

CpuIsa cpu_isa_supported() {
  static const CpuIsa supported = detect();
  return supported;
}

const Backend& cpu_backend(CpuIsa level) {
  if (static_cast<int>(level) > static_cast<int>(cpu_isa_supported()))
    fail("cpu kernels: this CPU has no ", cpu_isa_name(level), " (it supports up to ",
         cpu_isa_name(cpu_isa_supported()), ")");
  return *table_of(level);
}

CpuIsa set_cpu_isa(CpuIsa cap) {
  std::lock_guard<std::mutex> lock(g_choose);
  const CpuIsa best = cpu_isa_supported();
  const CpuIsa level = static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
  if (level != best) {
    // Refused (an error status, no effect) once oneDNN has run: the kernels
    // still switch; cpu_isa_describe says which level oneDNN kept.
    dnnl_set_max_cpu_isa(static_cast<dnnl_cpu_isa_t>(onednn_cap(level)));
  }
  // The table first, then the level: cpu_isa() returns without the lock once
  // g_level is set, so a thread that sees the level must find the table
  // (the other order let a concurrent first op fail with "no kernel backend
  // for cpu", Matmul.ConcurrentCallsFromManyThreadsAreCorrect about once in 30).
  detail::install_cpu_backend(table_of(level));
  g_capped.store(level != best);
  g_level.store(static_cast<int>(level));
  return level;
}

CpuIsa cpu_isa() {
  const int l = g_level.load();
  if (l >= 0) return static_cast<CpuIsa>(l);
  return set_cpu_isa(CpuIsa::amx);
}

std::string cpu_isa_describe() {
  const CpuIsa level = cpu_isa();
  std::string s = concat("cpu kernels: ", cpu_isa_name(level));
  if (g_capped.load()) s += concat(", capped (this CPU supports ", cpu_isa_name(cpu_isa_supported()), ")");
  return s + concat("; oneDNN: ", onednn_isa_name());
}

const char* onednn_isa_name() { return onednn_name(dnnl::get_effective_cpu_isa()); }

}  // namespace loom::kernels
