# CUDA for loom's GPU code (src/kernels/cuda, src/comm/nccl): found once
# here, at the top level, so every library that compiles .cu files sees the
# same compiler and architectures. LOOM_CUDA=AUTO (the default) builds the
# GPU code where the CUDA toolkit and nvcc are found and skips it, with a
# message, where they are not: the CPU build is the same either way.
# LOOM_CUDA=ON makes a missing toolkit an error; OFF never builds it.
set(LOOM_CUDA AUTO CACHE STRING "Build loom's CUDA code: AUTO (where nvcc is found), ON (required) or OFF")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS AUTO ON OFF)
# SASS for A100 (80), H100/H200 (90) and B200 (100), plus compute_80 PTX
# that the driver can compile for any later GPU. scripts/gpu-check.sh builds
# for 90 alone.
set(LOOM_CUDA_ARCHITECTURES "80;90-real;100-real" CACHE STRING "CUDA_ARCHITECTURES of loom's CUDA code")

set(LOOM_HAVE_CUDA OFF)
if(NOT LOOM_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    include(CheckLanguage)
    # The found toolkit's own nvcc unless the user chose a CUDA compiler.
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
      set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
    endif()
    check_language(CUDA)
  endif()
  if(CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc 13 (which has one): a target's
    # CUDA_STANDARD follows its CXX_STANDARD (20), so tell CMake the flag.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(LOOM_HAVE_CUDA ON)
    message(STATUS "loom: CUDA code built (CUDA ${CUDAToolkit_VERSION}, ${CMAKE_CUDA_COMPILER}, "
                   "architectures ${LOOM_CUDA_ARCHITECTURES})")
  elseif(LOOM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but no CUDA toolkit with nvcc was found (install the CUDA toolkit, "
                        "or set CUDAToolkit_ROOT / CMAKE_CUDA_COMPILER)")
  else()
    message(STATUS "loom: CUDA code not built (no CUDA toolkit with nvcc found)")
  endif()
endif()

# loom_cuda_target(target): nvcc compiles target's .cu files as C++20 for
# LOOM_CUDA_ARCHITECTURES, with the project's g++ warning flags passed to the
# host compiler; cudart is the shared CUDA::cudart the target links.
function(loom_cuda_target target)
  get_target_property(host_options ${target} COMPILE_OPTIONS)
  if(host_options)
    list(JOIN host_options "," host_options_csv)
    set_target_properties(${target} PROPERTIES COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:${host_options}>")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${host_options_csv}>)
  endif()
  # --fmad=false
  # for the reason the C++ flags carry -ffp-contract=off: whether a * b + c
  # becomes one FMA is then the source's choice (fmaf), not the compiler's,
  # so an elementwise kernel rounds as the CPU's does.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --fmad=false>)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${LOOM_CUDA_ARCHITECTURES}"
                                             CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF
                                             CUDA_RUNTIME_LIBRARY None)
endfunction()
