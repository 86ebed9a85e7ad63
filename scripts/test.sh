#!/usr/bin/env bash
# Installs dependencies, builds with warnings as errors, checks formatting, and
# runs every test: unit tests and, as root, the BPF and integration tests; then
# the same suites again built with ASan + UBSan (scripts/test-sanitizers.sh,
# build-asan/), where any memory error, leak or undefined behaviour fails.
# Nothing is skipped: a test that cannot run fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
TLSPROF_WERROR=ON "$root/scripts/build.sh"
"$root/scripts/check-format.sh"
cd "$root/build"
ctest --output-on-failure --timeout 900 -L unit
ctest --output-on-failure --timeout 900 -L bpf
"$root/scripts/test-sanitizers.sh"
