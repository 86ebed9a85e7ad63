# go_binary(NAME [LDFLAGS flags] [TAGS tags])
#
# Builds the Go main package in the current source directory into
# build/bin/NAME with Debian's Go toolchain: standard library only (no module
# downloads, GOPROXY=off), cgo off, and the Go caches in the build tree (one
# cache for all Go targets) so the build touches nothing outside it.
# LDFLAGS go to `go build -ldflags` (e.g. "-s -w": no symbol table, no DWARF).
# TAGS go to `go build -tags` (comma-separated build constraints), so one
# source directory can build variants that link different packages.
find_program(GO_EXECUTABLE go REQUIRED)

function(go_binary name)
  cmake_parse_arguments(G "" "LDFLAGS;TAGS" "" ${ARGN})
  set(out ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/${name})
  set(env GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
          GOCACHE=${CMAKE_BINARY_DIR}/gocache GOPATH=${CMAKE_BINARY_DIR}/gopath)
  file(GLOB sources ${CMAKE_CURRENT_SOURCE_DIR}/*.go)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E env ${env} ${GO_EXECUTABLE} build "-ldflags=${G_LDFLAGS}" "-tags=${G_TAGS}" -o ${out} .
    WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
    DEPENDS ${sources} ${CMAKE_CURRENT_SOURCE_DIR}/go.mod
    COMMENT "Building ${name} (Go)"
    VERBATIM)
  add_custom_target(${name} ALL DEPENDS ${out})
endfunction()
