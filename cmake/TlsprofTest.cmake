# tlsprof_test_driver_flags(TARGET): a test's own code is compiled at -O0, in
# both trees: the code it tests keeps its tree's optimization (-O2, or -O1
# under the sanitizers), the driver compiles in half the time.
function(tlsprof_test_driver_flags target)
  target_compile_options(${target} PRIVATE -O0)
endfunction()

# tlsprof_test(NAME SOURCES <src>... LIBS <lib>... [BPF] [OPTIMIZED])
#
# Registers a GoogleTest binary with CTest. Tests that need root and a real
# kernel pass BPF and get the label "bpf"; the rest get "unit". CI runs both.
# BPF tests drive the kernel's sampler and probes against their own processes
# and count what they see, so they hold the CPU lock (tlsprof_cpu,
# tests/CMakeLists.txt) like every other test whose figures depend on the CPU
# it gets. The test's own code is a driver at -O0 (above), but with OPTIMIZED,
# for a test whose subject is its own machine code (stack walks through its
# own frames), which keeps the tree's optimization.
function(tlsprof_test name)
  cmake_parse_arguments(T "BPF;OPTIMIZED" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    TLSPROF_SOURCE_DIR="${CMAKE_SOURCE_DIR}" TLSPROF_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(NOT T_OPTIMIZED)
    tlsprof_test_driver_flags(${name})
  endif()
  add_test(NAME ${name} COMMAND ${name})
  if(T_BPF)
    set_tests_properties(${name} PROPERTIES LABELS bpf RESOURCE_LOCK tlsprof_cpu)
  else()
    set_tests_properties(${name} PROPERTIES LABELS unit)
  endif()
endfunction()
