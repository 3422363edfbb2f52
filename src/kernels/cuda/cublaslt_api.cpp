#include "kernels/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <mutex>

#include "core/error.h"

namespace loom::kernels::cuda {
namespace {

#define LOOM_STRINGIFY_(x) #x
#define LOOM_STRINGIFY(x) LOOM_STRINGIFY_(x)
// The soname of the cuBLAS major version loom was compiled against.
constexpr const char* kMajor = LOOM_STRINGIFY(CUBLAS_VER_MAJOR);
constexpr const char* kLibrary = "libcublasLt.so." LOOM_STRINGIFY(CUBLAS_VER_MAJOR);

struct Loaded {
  CublasLtApi api;
  std::string why;  // "" when api is complete
};

Loaded load() {
  Loaded r;
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);  // kept open for the process's life
  if (lib == nullptr) {
    const char* e = dlerror();
    r.why = concat("cannot load ", kLibrary, " (CUDA's cuBLASLt, for the GPU's GEMMs): ", e ? e : "unknown error",
                   "; install cuBLAS ", kMajor, " (CUDA's toolkit) or add its folder to LD_LIBRARY_PATH");
    return r;
  }
#define LOOM_CUBLASLT_LOAD(name)                                                                    \
  r.api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));                              \
  if (r.api.name == nullptr && r.why.empty())                                                       \
    r.why = concat(kLibrary, " has no function ", #name, ": a cuBLAS older than the one loom was built with");
  LOOM_CUBLASLT_FUNCTIONS(LOOM_CUBLASLT_LOAD)
#undef LOOM_CUBLASLT_LOAD
  return r;
}

const Loaded& loaded() {
  static const Loaded r = load();
  return r;
}

}  // namespace

std::string cublaslt_unavailable_reason() { return loaded().why; }

const CublasLtApi& cublaslt() {
  const Loaded& r = loaded();
  LOOM_REQUIRE(r.why.empty(), r.why);
  return r.api;
}

}  // namespace loom::kernels::cuda
