// The instruction-set cap of a test process: LOOM_ISA, read by the tests'
// mains as loom's main reads it (src/kernels/cpu_isa.h). CTest runs the
// kernel and serving tests once per level with it (tests/isa_levels.cmake),
// and `LOOM_ISA=avx2 bash scripts/test.sh` forces the whole suite to a level.
#pragma once

namespace loom::test {

// The process exit status that CTest reports as "skipped" (SKIP_RETURN_CODE).
inline constexpr int kSkipExitCode = 77;

// Applies LOOM_ISA if set: 0 when the tests may run, kSkipExitCode (after
// printing why) when this CPU lacks the level, 2 for a value that names no
// level.
int apply_isa_from_env();

}  // namespace loom::test
