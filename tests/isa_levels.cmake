# Every CPU kernel's tests at every instruction-set level (DESIGN.md §1.9):
# the kernel tests and the paged runner's run once per level besides the
# plain run (which takes the machine's best), each level forced with LOOM_ISA
# (common/isa_env.h), so that an AVX-512 machine also tests the AVX2 and
# generic paths. One CTest test per executable and level:
# isa_avx2.test_attention, labelled isa_avx2. A level the CPU lacks exits 77
# and CTest reports it skipped, with the reason printed; so does the
# machine's best level (LOOM_ISA_SKIP_BEST), which the plain run has tested.
set(LOOM_ISA_TEST_LEVELS generic avx2 avx512 avx512_bf16 amx)
file(GLOB isa_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kernels/test_*.cpp)
list(APPEND isa_test_sources
  ${CMAKE_CURRENT_SOURCE_DIR}/model/test_block_seams.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/model/test_paged_runner.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/model/test_quant_runner.cpp)
# (The serving engine's tests are left out: test_engine_determinism.cpp runs
# the engine at every level itself and compares their bits.)
foreach(source ${isa_test_sources})
  get_filename_component(name ${source} NAME_WE)
  string(REPLACE "test_" "ref_" ref ${name})
  foreach(level ${LOOM_ISA_TEST_LEVELS})
    set(args "")
    # The generic level's serving GEMM is a loop of std::fma calls (correct,
    # never fast): the LM-head case (50257 x 768) takes minutes there, while
    # the other cases already run the same kernel.
    if(level STREQUAL "generic" AND name STREQUAL "test_batch_invariance")
      set(args --gtest_filter=-BatchInvariance.LmHead*)
    endif()
    add_test(NAME isa_${level}.${name} COMMAND ${name} ${args})
    set_tests_properties(isa_${level}.${name} PROPERTIES ENVIRONMENT "LOOM_ISA=${level};LOOM_ISA_SKIP_BEST=1" SKIP_RETURN_CODE 77
                         LABELS "isa_${level};isa" TIMEOUT 900)
    if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/ref/${ref}.py)
      set_tests_properties(isa_${level}.${name} PROPERTIES FIXTURES_REQUIRED ${ref})
    endif()
  endforeach()
endforeach()
