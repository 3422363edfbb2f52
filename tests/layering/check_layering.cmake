# cmake -DBUILD_DIR=... -DTARGET=layering_<from> -DFROM=<from> -DHEADERS=to/h,to2/h2,...
#       -DGENERATOR=<CMake generator> -P check_layering.cmake
# Builds the layering target (one source per forbidden include, each must fail
# to compile) with keep-going, then requires the compiler to have reported
# every header missing. Prints one line per direction; fails naming each
# header that was found (a direction the build no longer forbids).
string(REPLACE "," ";" HEADERS "${HEADERS}")
# Ninja and Make each spell "keep going after a failed job" their own way.
if(GENERATOR MATCHES "Ninja")
  set(KEEP_GOING -k 0)
else()
  set(KEEP_GOING -k)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET} -- ${KEEP_GOING}
                OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
set(open_directions "")
foreach(header ${HEADERS})
  string(REGEX REPLACE "/[^/]*$" "" to ${header})
  string(FIND "${out}" "${header}: No such file" at)
  if(at EQUAL -1)
    message("${FROM} -> ${to}: NOT refused (the compiler did not report ${header} missing)")
    list(APPEND open_directions "${FROM} -> ${to}")
  else()
    message("${FROM} -> ${to}: refused (${header}: No such file)")
  endif()
endforeach()
if(open_directions)
  message("build output:\n${out}")
  message(FATAL_ERROR "layering: loom_${FROM} can include headers DESIGN.md §2 forbids it: ${open_directions}")
endif()
