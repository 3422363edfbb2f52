// cuBLASLt's functions, loaded from libcublasLt.so.<major> when the CUDA
// backend is first used instead of linked: loading the library runs its
// initialisers, ~0.45 s and ~200 MB resident on every start of a program
// linked to it (measured on this project's CPU machines), which every loom
// command would pay for a GPU that only `train --device cuda` uses. Internal
// to kernels/cuda (gemm.cu calls through it).
#pragma once

#include <cublasLt.h>

#include <string>

namespace loom::kernels::cuda {

#define LOOM_CUBLASLT_FUNCTIONS(X)                                                                         \
  X(cublasLtCreate)                                                                                        \
  X(cublasLtGetStatusName)                                                                                 \
  X(cublasLtGetStatusString)                                                                               \
  X(cublasLtMatmul)                                                                                        \
  X(cublasLtMatmulAlgoGetHeuristic)                                                                        \
  X(cublasLtMatmulDescCreate)                                                                              \
  X(cublasLtMatmulDescDestroy)                                                                             \
  X(cublasLtMatmulDescSetAttribute)                                                                        \
  X(cublasLtMatmulPreferenceCreate)                                                                        \
  X(cublasLtMatmulPreferenceDestroy)                                                                       \
  X(cublasLtMatmulPreferenceSetAttribute)                                                                  \
  X(cublasLtMatrixLayoutCreate)                                                                            \
  X(cublasLtMatrixLayoutDestroy)                                                                           \
  X(cublasLtMatrixLayoutSetAttribute)

struct CublasLtApi {
#define LOOM_CUBLASLT_MEMBER(name) decltype(&::name) name = nullptr;
  LOOM_CUBLASLT_FUNCTIONS(LOOM_CUBLASLT_MEMBER)
#undef LOOM_CUBLASLT_MEMBER
};

// "" once the library is loaded (it is then kept), else why it cannot be
// (the file name and dlopen's or dlsym's message). Thread-safe.
std::string cublaslt_unavailable_reason();
// The loaded functions; loom::Error with cublaslt_unavailable_reason's text
// when the library cannot be loaded.
const CublasLtApi& cublaslt();

}  // namespace loom::kernels::cuda
