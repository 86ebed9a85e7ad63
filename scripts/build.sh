#!/usr/bin/env bash
# Configures and builds tlsprof into build/ (binaries in build/bin).
# TLSPROF_WERROR=ON (CI) turns warnings into errors.
# Line tables only (-g1) instead of full debug information: backtraces, sanitizer reports and perf keep function,
# file and line, and the C++ build takes a quarter less CPU (bench/README.md, "Build and CI time"). The BPF objects
# keep their own -g (BTF; cmake/BpfObject.cmake). For full DWARF, configure a build directory by hand.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTLSPROF_WERROR="${TLSPROF_WERROR:-OFF}" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build "$root/build" -j"$(nproc)"
