#!/usr/bin/env bash
# The README's test command, and what CI runs (.ci/run): installs the dependencies, builds, and runs every test in
# passes that each run even when an earlier one failed (the Debian 13 root of today's TLS stacks,
# scripts/make-trixie-root.sh, is made beside the build):
#   release  the release build (warnings as errors): every CTest test, `ctest -j` on all CPUs; tests that measure
#            CPU hold a resource lock, so no two of them ever overlap (tests/CMakeLists.txt)
#   format   clang-format's check of every C/C++ source
#   asan     the ASan + UBSan build (build-asan/, clang, warnings as errors): the unit tier, every corpus replay and
#            the integration tests labelled `asan` (scripts/test-sanitizers.sh; the README says which and why)
#   fuzz     FUZZ_PICK (8) of the libFuzzer targets of that same tree (it is configured with TLSPROF_FUZZ), the next
#            8 each hour, each run for FUZZ_SECONDS (30) from its corpus, as many at once as there are CPUs (every
#            corpus of every target is replayed in the release and asan passes)
# At the end it prints the slowest tests and the time of each pass (scripts/test-summary.py), and exits non-zero if
# any pass failed. Nothing is skipped: a test that cannot run fails. Logs: build/test-logs/.
#
# Arguments go to every ctest run: `scripts/test.sh -L unit` runs one tier of each pass.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
logs=$root/build/test-logs
status=0

# stage NAME COMMAND...: runs COMMAND with its output on the terminal and in $logs/NAME.log, and records its time and
# exit status in $logs/passes.tsv for the summary.
stage() {
  local name=$1 start=$SECONDS rc
  shift
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\n' "$name" $((SECONDS - start)) "$rc" >>"$logs/passes.tsv"
  if ((rc != 0)); then
    echo "==== $name FAILED (exit $rc)" >&2
    status=1
  fi
  return "$rc"
}

mkdir -p "$logs"
: >"$logs/passes.tsv"
# Without the dependencies nothing below can build: the only stage whose failure ends the run.
stage deps "$root/scripts/install-deps.sh" || exit 1
# The Debian 13 root (debootstrap and apt: mostly network and disk) is made while the build uses the CPUs, and
# waited for before the tests; its time is the summary's `trixie` line. The tests that need it fail without it.
(
  start=$SECONDS
  "$root/scripts/make-trixie-root.sh" >"$logs/trixie.log" 2>&1
  rc=$?
  echo "$((SECONDS - start))" >"$logs/trixie.seconds"
  exit "$rc"
) &
trixie_pid=$!
# Likewise the Debian 12 root that tests/integration/test_systemd.py boots with systemd-nspawn (debootstrap, about
# 5 minutes the first time): its time is the summary's `systemd-root` line.
(
  start=$SECONDS
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import systemd_container; systemd_container.ensure_root()' \
    "$root/tests/integration" >"$logs/systemd-root.log" 2>&1
  rc=$?
  echo "$((SECONDS - start))" >"$logs/systemd-root.seconds"
  exit "$rc"
) &
systemd_root_pid=$!
build_ok=0
stage build env TLSPROF_WERROR=ON "$root/scripts/build.sh" && build_ok=1
wait "$trixie_pid"
trixie_rc=$?
cat "$logs/trixie.log"
printf '%s\t%s\t%s\n' trixie "$(cat "$logs/trixie.seconds" 2>/dev/null || echo 0)" "$trixie_rc" >>"$logs/passes.tsv"
((trixie_rc == 0)) || status=1
wait "$systemd_root_pid"
systemd_root_rc=$?
((systemd_root_rc == 0)) || cat "$logs/systemd-root.log"
printf '%s\t%s\t%s\n' systemd-root "$(cat "$logs/systemd-root.seconds" 2>/dev/null || echo 0)" "$systemd_root_rc" \
  >>"$logs/passes.tsv"
((systemd_root_rc == 0)) || status=1
if ((build_ok)); then
  stage release ctest --test-dir "$root/build" --output-on-failure --timeout 900 -j"$jobs" "$@"
fi
stage format "$root/scripts/check-format.sh"
stage asan env TLSPROF_WERROR=ON "$root/scripts/test-sanitizers.sh" "$@"
stage fuzz "$root/bench/fuzz.sh" --build "$root/build-asan" --jobs "$jobs" --pick "${FUZZ_PICK:-8}" "${FUZZ_SECONDS:-30}"

python3 "$root/scripts/test-summary.py" "$logs" || status=1
exit $status
