// The main of the GPU tests (label gpu): registers the CUDA backend on
// device 0 and runs GoogleTest; where no GPU is usable it prints why and
// exits 77, which CTest reports as skipped (SKIP_RETURN_CODE, tests/gpu.cmake).
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_backend.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string why = loom::kernels::cuda_unavailable_reason(0);
  if (!why.empty()) {
    std::printf("SKIPPED: no GPU to run on: %s\n", why.c_str());
    return 77;
  }
  loom::kernels::register_cuda_backend(0);
  std::printf("GPU: %s\n", loom::kernels::cuda_device_description(0).c_str());
  return RUN_ALL_TESTS();
}
