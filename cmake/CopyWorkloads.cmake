# tlsprof_copy_workloads(FROM <bin dir>)
#
# The workloads (workloads/) are what the agent measures and are never
# instrumented, so the sanitizer tree need not compile a second copy of them:
# with TLSPROF_WORKLOADS_FROM set (scripts/test-sanitizers.sh points it at the
# release tree's bin/), workloads/ is added EXCLUDE_FROM_ALL and this copies
# each of its programs (executables, and go_binary's targets, which are named
# after their program) from FROM into this tree's bin/ at build time. A
# program missing there fails the build, saying which.
function(tlsprof_copy_workloads)
  cmake_parse_arguments(W "" "FROM" "" ${ARGN})
  set(dirs ${CMAKE_SOURCE_DIR}/workloads)
  set(commands "")
  set(names "")
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE" OR type STREQUAL "UTILITY")
        list(APPEND names ${target})
        list(APPEND commands COMMAND ${CMAKE_COMMAND} -E copy_if_different ${W_FROM}/${target}
             ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/${target})
      endif()
    endforeach()
  endwhile()
  list(JOIN names " " listed)
  add_custom_target(workloads_copied ALL ${commands}
                    COMMENT "Copying the workloads from ${W_FROM}: ${listed}" VERBATIM)
endfunction()
