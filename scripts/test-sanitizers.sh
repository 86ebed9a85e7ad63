#!/usr/bin/env bash
# Builds tlsprof with ASan + UBSan into build-asan/ (clang, -DTLSPROF_FUZZ=ON: a sanitizer build that also holds the
# libFuzzer targets, which scripts/test.sh's fuzz pass then runs from this tree; TLSPROF_WERROR=ON, as CI sets it,
# makes clang's warnings errors here as gcc's are in the release tree) and runs the sanitizer pass's
# part of the test suite against it (below), whose integration tests run the sanitized binaries of build-asan/bin
# (TLSPROF_BIN comes from that build's CTest registration). A pass of scripts/test.sh, so CI runs it. Instrumented:
# tlsprof's code (agent, collector, tools, tests); not: the workloads it measures (workloads/CMakeLists.txt says
# why), which are copied from the release tree build/ (scripts/build.sh first). Tests see TLSPROF_SANITIZED=1 and
# print, rather than assert, the CPU and memory budgets ASan's own cost breaks (tests/integration/tlsprof_testlib.py).
# Any sanitizer report fails it: every instrumented process (also the agent and collector the Python tests start,
# whose exit status a test may not look at) writes its ASan, UBSan and LeakSanitizer reports to a log directory, and
# a non-empty directory fails the run after the tests, printing each report; the first UBSan report also ends its
# process with a non-zero status (-fno-sanitize-recover=all), which fails its test.
#
# Arguments, if any, select the tests instead of the pass's labels: `scripts/test-sanitizers.sh -R 'bounds|faults_'`
# runs those (any test of the tree, in the pass or not).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-asan"
jobs=$(nproc)
# clang, at -O1 with line tables (-g1): sanitizer reports keep function, file and line, and clang builds this tree in
# half gcc's time (bench/README.md, "Build and CI time"); the test drivers themselves at -O0 (cmake/TlsprofTest.cmake).
tree_flags=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")

start=$SECONDS
# The workloads, never instrumented, are the release tree's (cmake/CopyWorkloads.cmake): scripts/build.sh first.
if [[ ! -x $root/build/bin/tlsprof-demo ]]; then
  echo "sanitizers: no release build in $root/build (the workloads come from it): run scripts/build.sh" >&2
  exit 1
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTLSPROF_SANITIZE=ON -DTLSPROF_FUZZ=ON \
  -DTLSPROF_WERROR="${TLSPROF_WERROR:-OFF}" \
  -DTLSPROF_WORKLOADS_FROM="$root/build/bin" "${tree_flags[@]}" >/dev/null
cmake --build "$build" -j"$jobs"
echo "sanitizers: build took $((SECONDS - start)) s"

# Reports from every process go to $logs/<name>.<pid>; world-writable (sticky), since tests run the agent and
# collector as other users too.
logs="$build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
chmod 1777 "$logs"
# halt_on_error: the first error aborts the process (UBSan too: -fno-sanitize-recover=all at build time).
# detect_leaks: LeakSanitizer at exit; tests/sanitizers/lsan.supp lists the only leaks ignored (third-party static
# state), each with its reason.
# verify_asan_link_order=0: test_faults_pipeline preloads libfaketime into the agent (clock skew); ASan would
# refuse to start behind another LD_PRELOAD library, though the two intercept different functions.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:log_path=$logs/asan:strict_init_order=1:verify_asan_link_order=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"

# The sanitizer pass runs a chosen part of the suite, not all of it again (the README lists it and says why): the
# unit tier (every unit test and every fuzz-corpus replay), the BPF tests (the sampler, the stack walker and the usage
# probes against the kernel) and the integration tests labelled "asan" (tests/CMakeLists.txt), which drive the
# agent's and the collector's real paths under faults and bad input. The rest run in the release pass only (the
# README says which and why, and what `bounds`, left out for time, covers that these do not).
status=0
cd "$build"
start=$SECONDS
selection=(-L '^(unit|bpf|asan)$')
(($#)) && selection=("$@")
ctest --output-on-failure --timeout 1800 -j"$jobs" "${selection[@]}" || status=1
echo "sanitizers: ctest ${selection[*]} took $((SECONDS - start)) s"

shopt -s nullglob
reports=("$logs"/*)
if [[ ${#reports[@]} -gt 0 ]]; then
  echo "sanitizers: ${#reports[@]} report(s) in $logs:" >&2
  for r in "${reports[@]}"; do
    echo "==== $r" >&2
    cat "$r" >&2
  done
  status=1
fi
if [[ $status -ne 0 ]]; then
  echo "sanitizers: FAILED" >&2
else
  echo "sanitizers: passed, no sanitizer reports"
fi
exit $status
