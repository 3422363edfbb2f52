# Labels on every test, and under LOOM_SANITIZE the options the sanitizer
# runtimes read at start-up. Included last by tests/CMakeLists.txt, once every
# test is defined. A test may carry several labels; `ctest -L unit` runs one
# kind, `ctest -LE slow` leaves one out.
#
#   unit  one process, no loom executable: the GoogleTest tests of
#         tests/<module>/test_*.cpp and the build's own checks (Layering.*,
#         Style.*)
#   mpi   runs under mpirun: every test named mpi.* (tests/mpi.cmake's
#         mpi.<name>.np<N> and the multi-rank command-line tests)
#   ref   needs the PyTorch reference values: the ref_* fixtures
#         (tests/ref/ref_<name>.py) and the tests of test_<name> that require them
#   cli   runs the loom executable: every test named Cli.* or mpi.cli.*; a
#         test named otherwise that runs it adds the label where it is defined
#   slow  took over 20 s in `ctest -j2` on the 2-core reference machine
#         (LOOM_SLOW_TESTS below; measured, so re-measure when adding to it)
#
# Labels follow from where and how a test is defined, so a new
# tests/<module>/test_*.cpp or mpi_test_*.cpp is labelled without listing it.

# Measured: scripts/test.sh (ctest -j2) of a clean clone of 7462efd on the
# 2-core AMD EPYC, 2026-11-25; seconds in that run.
set(LOOM_SLOW_TESTS
  Cli.Gguf.LlamaCppDecodesLoomsFilesAsLoomDoes               # 33.0 (2026-11-28, Xeon, 2 cores: two trainings)
  mpi.Train.SigkillAtRandomTimesUnderZero3ResumesBitwise     # 54.7
  mpi.Train.SigkillWithTheStateOnDiskResumesBitwiseAndLeavesNoFile  # 36.9 with the optimizer alone (2026-12-01, EPYC Zen 3, 2 cores)
  mpi.dp.np8                                                 # 51.8
  mpi.dp.np4                                                 # 38.4
  mpi.pp.np2                                                 # 32.5
  mpi.pp_checkpoint.np8                                      # 28.1
  mpi.mesh.np8                                               # 27.0
  mpi.pp_checkpoint.np4                                      # 25.3
  TrainerTest.Fp16RunMatchesFp32RunOver20Steps               # 25.0
  mpi.dp.np3                                                 # 24.9
  mpi.Train.SigtermOnEveryRankStopsAtOneStepAndResumesBitwise  # 24.6
  mpi.pp_runtime.np8                                         # 24.1
  mpi.pp.np4                                                 # 23.8
  mpi.cli.SlurmSrunTrainsRefusesNoPmixAndResumesATimedOutJob # about 150 (2026-11-30, Xeon: a job waits for its time limit)
)

# Tests that run alone (RUN_SERIAL) under ctest -j: the serving engine's
# end-to-end tests run thousands of steps of small kernels, each an OpenMP
# parallel region; beside another test on 2 cores every region waits for a
# descheduled thread, and they ran 10-20x slower (EngineDeterminism: 28 s
# alone, 230 s beside others, measured 2026-11-27).
set(LOOM_SERIAL_TESTS_REGEX "^(Engine|EngineLogits|EngineDeterminism)[.]")

# The sanitizer runtimes' options (read by the runtimes, not by loom).
# Suppressions cover only third-party code (tests/sanitize/*.supp say what and
# why). Sanitized code runs slower, so every timeout is stretched.
set(LOOM_SANITIZER_ENV "")
set(LOOM_SANITIZER_TIMEOUT_FACTOR 1)
if(LOOM_SANITIZE STREQUAL "address")
  # allocator_may_return_null: an impossible allocation returns null, as the
  # real allocator's does, and the tests of loom's out-of-memory errors
  # (test_scratch) see what they would see without ASan, not an ASan abort.
  # A no-op dlclose, preloaded so that Open MPI's components stay mapped until
  # LeakSanitizer reports (why: sanitize/keep_loaded.cpp). Built without the
  # sanitizer: it is also preloaded into mpirun, sh and python. ASan then no
  # longer comes first in the library list, which it accepts when told
  # (verify_asan_link_order=0).
  add_library(loom_keep_loaded SHARED sanitize/keep_loaded.cpp)
  set_target_properties(loom_keep_loaded PROPERTIES COMPILE_OPTIONS "" LINK_OPTIONS ""
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set(LOOM_SANITIZER_ENV
    "ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:verify_asan_link_order=0:allocator_may_return_null=1"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
    "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/sanitize/lsan.supp:print_suppressions=0"
    "LD_PRELOAD=${CMAKE_CURRENT_BINARY_DIR}/libloom_keep_loaded.so")
  set(LOOM_SANITIZER_TIMEOUT_FACTOR 4)
elseif(LOOM_SANITIZE STREQUAL "thread")
  # history_size=7: the longest access history, so that the stack of an
  # earlier write by an Open MPI thread is restored and its suppression matches.
  set(LOOM_SANITIZER_ENV
    "TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/sanitize/tsan.supp:second_deadlock_stack=1:history_size=7")
  set(LOOM_SANITIZER_TIMEOUT_FACTOR 10)
endif()
# The MPI tests' watchdog stretches with ctest's timeouts (mpi_env.h).
if(LOOM_SANITIZER_ENV)
  list(APPEND LOOM_SANITIZER_ENV "LOOM_TEST_TIMEOUT_FACTOR=${LOOM_SANITIZER_TIMEOUT_FACTOR}")
endif()
# A test that matches its output with PASS_REGULAR_EXPRESSION ignores the exit
# status, so a sanitizer's report must fail it by its text.
set(LOOM_SANITIZER_REPORT "SUMMARY: [A-Za-z]+Sanitizer")

# Tests defined with add_test (their names are known now).
get_property(loom_defined_tests DIRECTORY PROPERTY TESTS)
foreach(test ${loom_defined_tests})
  set(labels "")
  if(test MATCHES "^ref_")
    list(APPEND labels ref)
  endif()
  if(test MATCHES "^mpi\\.")
    list(APPEND labels mpi)
  endif()
  if(test MATCHES "^(mpi\\.)?[Cc]li\\.")
    list(APPEND labels cli)
  endif()
  if(test MATCHES "^(Layering|Style)\\.")
    list(APPEND labels unit)
  endif()
  if(test IN_LIST LOOM_SLOW_TESTS)
    list(APPEND labels slow)
  endif()
  set_property(TEST ${test} APPEND PROPERTY LABELS ${labels})
  if(LOOM_SANITIZER_ENV)
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT ${LOOM_SANITIZER_ENV})
    set_property(TEST ${test} APPEND PROPERTY FAIL_REGULAR_EXPRESSION ${LOOM_SANITIZER_REPORT})
    get_test_property(${test} TIMEOUT timeout)
    if(timeout)
      math(EXPR timeout "${timeout} * ${LOOM_SANITIZER_TIMEOUT_FACTOR}")
      set_tests_properties(${test} PROPERTIES TIMEOUT ${timeout})
    endif()
  endif()
endforeach()

# GoogleTest tests are defined at test time, when gtest_discover_tests' script
# lists an executable's tests into <target>_TESTS; this script, included by
# CTest after those (TEST_INCLUDE_FILES keeps the order), labels them.
# LOOM_GTEST_TARGETS holds "target:label,label" per test executable.
set(script "# Generated by tests/properties.cmake.\n")
string(APPEND script "set(loom_slow_tests [==[${LOOM_SLOW_TESTS}]==])\n")
string(APPEND script "set(loom_sanitizer_env [==[${LOOM_SANITIZER_ENV}]==])\n")
string(APPEND script "set(loom_serial_tests_regex [==[${LOOM_SERIAL_TESTS_REGEX}]==])\n")
math(EXPR loom_gtest_timeout "600 * ${LOOM_SANITIZER_TIMEOUT_FACTOR}")
string(APPEND script [==[
function(loom_label_discovered tests labels)
  foreach(test IN LISTS tests)
    set(these "${labels}")
    list(FIND loom_slow_tests "${test}" at)
    if(NOT at EQUAL -1)
      list(APPEND these slow)
    endif()
    set_tests_properties("${test}" PROPERTIES LABELS "${these}")
    if(test MATCHES "${loom_serial_tests_regex}")
      set_tests_properties("${test}" PROPERTIES RUN_SERIAL TRUE)
    endif()
    if(loom_sanitizer_env)
]==])
string(APPEND script "      set_tests_properties(\"\${test}\" PROPERTIES ENVIRONMENT \"\${loom_sanitizer_env}\" TIMEOUT ${loom_gtest_timeout})\n")
string(APPEND script [==[
    endif()
  endforeach()
endfunction()
]==])
foreach(entry ${LOOM_GTEST_TARGETS})
  string(REPLACE ":" ";" parts ${entry})
  list(GET parts 0 target)
  list(GET parts 1 labels)
  string(REPLACE "," ";" labels ${labels})
  # An executable not built yet stands as one test, <target>_NOT_BUILT, that fails.
  string(APPEND script "if(DEFINED ${target}_TESTS)\n  loom_label_discovered(\"\${${target}_TESTS}\" \"${labels}\")\n"
                       "else()\n  loom_label_discovered(${target}_NOT_BUILT \"${labels}\")\nendif()\n")
endforeach()
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/discovered_test_properties.cmake "${script}")
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_BINARY_DIR}/discovered_test_properties.cmake)
