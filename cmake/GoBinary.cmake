# go_binary(NAME [LDFLAGS flags])
#
# Builds the Go main package in the current source directory into
# build/bin/NAME with Debian's Go toolchain: standard library only (no module
# downloads, GOPROXY=off), cgo off, and the Go caches in the build tree (one
# cache for all Go targets, TLSPROF_GOCACHE) so the build touches nothing
# outside the build trees.
# LDFLAGS go to `go build -ldflags` (e.g. "-s -w": no symbol table, no DWARF).
find_program(GO_EXECUTABLE go REQUIRED)
# Go's build cache is keyed by the inputs of each package (sources, toolchain,
# flags), so build trees may share one: scripts/test-sanitizers.sh points the
# ASan tree at the release tree's, whose Go programs are the same (Go is not
# instrumented), and the second build of each is a cache hit.
set(TLSPROF_GOCACHE ${CMAKE_BINARY_DIR}/gocache CACHE PATH "Go build cache (GOCACHE) of the Go workloads")

function(go_binary name)
  cmake_parse_arguments(G "" "LDFLAGS" "" ${ARGN})
  set(out ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/${name})
  set(env GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
          GOCACHE=${TLSPROF_GOCACHE} GOPATH=${CMAKE_BINARY_DIR}/gopath)
  file(GLOB sources ${CMAKE_CURRENT_SOURCE_DIR}/*.go)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E env ${env} ${GO_EXECUTABLE} build "-ldflags=${G_LDFLAGS}" -o ${out} .
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    DEPENDS ${sources} ${CMAKE_CURRENT_SOURCE_DIR}/go.mod
    COMMENT "Building ${name} (Go)"
    VERBATIM)
  add_custom_target(${name} ALL DEPENDS ${out})
endfunction()
