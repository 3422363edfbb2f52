# The GPU tests (label gpu), built where the CUDA backend is
# (src/kernels/cuda). Each executable is one CTest test that exits 77
# (skipped, with the reason printed) where no GPU is usable, so CI builds
# and "runs" them without a GPU; scripts/gpu-check.sh runs them on one.
#   test_backend_ops_cuda  every op of the backend table on the GPU against
#                          the CPU backend on the same inputs
#                          (tests/kernels/test_backend_ops.cpp, built again)
#   gpu_<name>             tests/gpu/cuda_<name>.cpp: model-sized shapes and
#                          run-to-run determinism (ops_large); training on
#                          the GPU against the CPU (train)
if(NOT TARGET loom_kernels_cuda)
  return()
endif()
add_library(loom_test_gpu_main STATIC gpu/main.cpp)
target_link_libraries(loom_test_gpu_main PUBLIC loom_test_common loom_kernels_cuda GTest::gtest)

add_executable(test_backend_ops_cuda kernels/test_backend_ops.cpp)
target_link_libraries(test_backend_ops_cuda PRIVATE loom_test_gpu_main)
add_test(NAME gpu.backend_ops COMMAND test_backend_ops_cuda)
set(gpu_tests gpu.backend_ops)

file(GLOB gpu_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/gpu/cuda_*.cpp)
foreach(source ${gpu_sources})
  get_filename_component(name ${source} NAME_WE)
  string(REPLACE "cuda_" "" name ${name})
  add_executable(gpu_${name} ${source})
  target_link_libraries(gpu_${name} PRIVATE loom_test_gpu_main loom_train)
  add_test(NAME gpu.${name} COMMAND gpu_${name})
  list(APPEND gpu_tests gpu.${name})
endforeach()
# loom train --device cuda under mpirun (tests/gpu/train_mpi.py): a rank more
# than the host's GPUs refused; on 2 GPUs, dp and tp over NCCL against CPUs.
find_package(MPI REQUIRED COMPONENTS CXX)
foreach(case refusal layouts)
  add_test(NAME gpu.train_mpi_${case}
           COMMAND ${LOOM_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/train_mpi.py $<TARGET_FILE:loom>
                   "${MPIEXEC_EXECUTABLE};--oversubscribe;--allow-run-as-root"
                   ${CMAKE_BINARY_DIR}/gpu_train_mpi_${case} ${case})
  list(APPEND gpu_tests gpu.train_mpi_${case})
endforeach()
set_tests_properties(${gpu_tests} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
