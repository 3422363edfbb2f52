#include "common/isa_env.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "kernels/cpu_isa.h"

namespace loom::test {

int apply_isa_from_env() {
  using namespace loom::kernels;
  const char* want = std::getenv("LOOM_ISA");
  if (want == nullptr || *want == '\0') return 0;
  std::optional<CpuIsa> level;
  try {
    level = cpu_isa_from_name_or_fail(want, "LOOM_ISA");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (static_cast<int>(*level) > static_cast<int>(cpu_isa_supported())) {
    std::printf("skipped: LOOM_ISA=%s, but this CPU supports up to %s\n", want, cpu_isa_name(cpu_isa_supported()));
    return kSkipExitCode;
  }
  // tests/isa_levels.cmake's extra runs: the plain run already tests the best level.
  const char* skip_best = std::getenv("LOOM_ISA_SKIP_BEST");
  if (skip_best != nullptr && *skip_best == '1' &&
      *level == cpu_isa_supported()) {
    std::printf("skipped: LOOM_ISA=%s is this CPU's best level, which the plain run of these tests takes\n", want);
    return kSkipExitCode;
  }
  set_cpu_isa(*level);
  std::printf("%s\n", cpu_isa_describe().c_str());
  return 0;
}

}  // namespace loom::test
