# The dependency direction of DESIGN.md §2 is enforced by include roots: a
# target that links only loom_core cannot include a kernels header. For each
# library below, a target linking only it tries to include one header of each
# folder it may not use (one generated source a folder; see
# forbidden_include.cpp.in); its test passes when the compiler reports every
# one of those headers missing.
#
#   library   may not include (what DESIGN.md §2 forbids and the code obeys)
set(LOOM_LAYERING_RULES
  "core:kernels,comm,mesh,io,text,model,parallel,infer,serve,train,cli"
  "kernels:comm,mesh,io,text,model,parallel,infer,serve,train,cli"
  "comm:kernels,mesh,io,text,model,parallel,infer,serve,train,cli"
  "mesh:kernels,io,text,model,parallel,infer,serve,train,cli"
  "io:kernels,comm,mesh,text,model,parallel,infer,serve,train,cli"
  "text:kernels,comm,mesh,io,model,parallel,infer,serve,train,cli"
  "model:comm,mesh,text,parallel,infer,serve,train,cli"
  "parallel:text,infer,serve,train,cli"
  "infer:comm,mesh,parallel,serve,train,cli"
  "serve:comm,mesh,parallel,train,cli"
  "train:infer,serve,cli")

# A folder's probe header: the first of its top-level headers, by name.
function(loom_layering_probe_header folder out)
  file(GLOB headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/src/${folder}/*.h)
  list(SORT headers)
  list(GET headers 0 first)
  set(${out} ${first} PARENT_SCOPE)
endfunction()

foreach(rule ${LOOM_LAYERING_RULES})
  string(REPLACE ":" ";" parts ${rule})
  list(GET parts 0 from)
  list(GET parts 1 forbidden)
  string(REPLACE "," ";" forbidden ${forbidden})
  set(sources "")
  set(headers "")
  set(name_tail "")
  foreach(to ${forbidden})
    loom_layering_probe_header(${to} probe)
    get_filename_component(header ${probe} NAME)
    set(source ${CMAKE_CURRENT_BINARY_DIR}/layering/${from}_includes_${to}.cpp)
    configure_file(${CMAKE_CURRENT_SOURCE_DIR}/layering/forbidden_include.cpp.in ${source} @ONLY)
    list(APPEND sources ${source})
    string(APPEND headers ",${probe}")
    string(SUBSTRING ${to} 0 1 initial)
    string(TOUPPER ${initial} initial)
    string(SUBSTRING ${to} 1 -1 rest)
    string(APPEND name_tail ${initial}${rest})
  endforeach()
  # OBJECT: compile only, so a direction that wrongly compiles is reported
  # as such, not as a link error.
  add_library(layering_${from} OBJECT EXCLUDE_FROM_ALL ${sources})
  target_link_libraries(layering_${from} PRIVATE loom_${from})
  string(SUBSTRING ${from} 0 1 initial)
  string(TOUPPER ${initial} initial)
  string(SUBSTRING ${from} 1 -1 rest)
  string(SUBSTRING ${headers} 1 -1 headers)
  set(test Layering.${initial}${rest}CannotInclude${name_tail})
  add_test(NAME ${test}
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=layering_${from} -DFROM=${from}
                   -DHEADERS=${headers} "-DGENERATOR=${CMAKE_GENERATOR}"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_layering.cmake)
  # LC_ALL=C: the compiler's message in English whatever the user's locale.
  # One build at a time in the build tree: concurrent ninja runs there would
  # race on its logs.
  set_tests_properties(${test} PROPERTIES ENVIRONMENT LC_ALL=C RESOURCE_LOCK loom_build_tree TIMEOUT 300)
endforeach()
