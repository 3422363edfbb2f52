# The dependency direction of DESIGN.md §2 is enforced by include roots: a
# target that links only loom_core cannot include a kernels header. For each
# library below, a target linking only it tries to include one header of each
# folder it may not use (one generated source a folder; see
# forbidden_include.cpp.in); its test passes when the compiler reports every
# one of those headers missing.
#
#   library   may not include (what DESIGN.md §2 forbids and the code obeys;
#             serve_jinja is loom_serve_jinja, serve/http the folder src/serve/http)
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
  "serve_jinja:kernels,comm,mesh,io,text,model,parallel,infer,serve,serve/http,serve/store,train,cli"
  "serve_http:kernels,comm,mesh,io,text,model,parallel,infer,serve,serve/jinja,serve/store,train,cli"
  "serve_store:comm,mesh,parallel,infer,serve,serve/http,train,cli"
  "serve:comm,mesh,parallel,train,cli"
  "train:infer,serve,plan,cli"
  "plan:infer,serve,cli")

# "serve/http" or "serve_http" as "ServeHttp" (a test name's part).
function(loom_layering_camel text out)
  string(REPLACE "/" ";" parts "${text}")
  string(REPLACE "_" ";" parts "${parts}")
  set(camel "")
  foreach(part ${parts})
    string(SUBSTRING ${part} 0 1 initial)
    string(TOUPPER ${initial} initial)
    string(SUBSTRING ${part} 1 -1 rest)
    string(APPEND camel ${initial}${rest})
  endforeach()
  set(${out} ${camel} PARENT_SCOPE)
endfunction()

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
    string(REPLACE "/" "_" to_file ${to})
    set(source ${CMAKE_CURRENT_BINARY_DIR}/layering/${from}_includes_${to_file}.cpp)
    configure_file(${CMAKE_CURRENT_SOURCE_DIR}/layering/forbidden_include.cpp.in ${source} @ONLY)
    list(APPEND sources ${source})
    string(APPEND headers ",${probe}")
    loom_layering_camel(${to} to_camel)
    string(APPEND name_tail ${to_camel})
  endforeach()
  # OBJECT: compile only, so a direction that wrongly compiles is reported
  # as such, not as a link error.
  add_library(layering_${from} OBJECT EXCLUDE_FROM_ALL ${sources})
  target_link_libraries(layering_${from} PRIVATE loom_${from})
  loom_layering_camel(${from} from_camel)
  string(SUBSTRING ${headers} 1 -1 headers)
  set(test Layering.${from_camel}CannotInclude${name_tail})
  add_test(NAME ${test}
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=layering_${from} -DFROM=${from}
                   -DHEADERS=${headers} "-DGENERATOR=${CMAKE_GENERATOR}"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_layering.cmake)
  # LC_ALL=C: the compiler's message in English whatever the user's locale.
  # One build at a time in the build tree: concurrent ninja runs there would
  # race on its logs.
  set_tests_properties(${test} PROPERTIES ENVIRONMENT LC_ALL=C RESOURCE_LOCK loom_build_tree TIMEOUT 300)
endforeach()
