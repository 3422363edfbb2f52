# LOOM_SANITIZE: build every target with a sanitizer runtime.
#   address  AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer,
#            part of ASan on Linux). A UB finding aborts (no recover), so the
#            test that hits it fails instead of printing and passing.
#   thread   ThreadSanitizer, for the communicator's progress thread
#            (src/comm/engine.*) and anything else that starts threads.
# The two cannot be combined (the runtimes conflict). -g so that a finding's
# stack names file:line; -fno-omit-frame-pointer so that the runtimes' fast
# unwinder sees every frame. The options the runtimes read at start-up
# (suppressions, halt on error) are set per test in tests/CMakeLists.txt.
set(LOOM_SANITIZE "" CACHE STRING "Sanitizer build: empty (none), address (address+undefined) or thread")
set_property(CACHE LOOM_SANITIZE PROPERTY STRINGS "" address thread)

if(LOOM_SANITIZE STREQUAL "address")
  set(loom_sanitize_flags -fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined)
elseif(LOOM_SANITIZE STREQUAL "thread")
  set(loom_sanitize_flags -fsanitize=thread)
elseif(NOT LOOM_SANITIZE STREQUAL "")
  message(FATAL_ERROR "LOOM_SANITIZE = '${LOOM_SANITIZE}' is invalid: allowed values are address, thread or empty")
endif()

# C++ only: the CUDA sources of src/comm/nccl are device code, left as they are.
if(loom_sanitize_flags)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${loom_sanitize_flags};-fno-omit-frame-pointer;-g>")
  add_link_options(${loom_sanitize_flags})
  message(STATUS "loom: sanitizer build (${LOOM_SANITIZE})")
endif()
