#!/usr/bin/env bash
# Configures and builds tlsprof into build/ (binaries in build/bin).
# TLSPROF_WERROR=ON (CI) turns warnings into errors.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/build-flags.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTLSPROF_WERROR="${TLSPROF_WERROR:-OFF}" "${debug_flags[@]}" >/dev/null
cmake --build "$root/build" -j"$(nproc)"
