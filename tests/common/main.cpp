// The main of every one-process test: GoogleTest's, after applying the
// instruction-set cap LOOM_ISA (common/isa_env.h).
#include <gtest/gtest.h>

#include "common/isa_env.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const int code = loom::test::apply_isa_from_env(); code != 0) return code;
  return RUN_ALL_TESTS();
}
