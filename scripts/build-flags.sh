# Sourced by scripts/build.sh and scripts/test-sanitizers.sh: the compile flags of their RelWithDebInfo builds.
# Line tables only (-g1) instead of full debug information: backtraces, sanitizer reports and perf keep function,
# file and line, and the C++ build takes a quarter less CPU (bench/README.md, "Build and CI time"). The BPF objects
# keep their own -g (BTF; cmake/BpfObject.cmake). A developer who wants full DWARF configures build/ by hand.
debug_flags=(-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG")
