#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz/ for a given time each and prints,
# per target: seconds run, executions, exec/s, coverage (cov: edges, ft: features), corpus
# size, peak RSS and crashes; with --coverage, then, per target, how much of
# the project's code its final corpus covers, by source file. Exits non-zero if any target crashed (or leaked, timed out or ran out of
# memory); the inputs are kept and their paths printed.
#
# Usage: bench/fuzz.sh [--jobs N] [--merge] [--build DIR] [--pick N] [--keep-going] [--coverage]
#                      [SECONDS_PER_TARGET=600] [TARGET...]
#   TARGET      elf_symbols go_pclntab eh_frame debuglink proc_maps collector_ingest
#               elf_functions probe_plan boringssl_plan go_plan accessors archive_match
#               collector_state spool_batch, and the large-input variants
#               elf_symbols_large eh_frame_large elf_functions_large go_plan_large
#               archive_match_large (default: all; the _fuzz suffix may be given)
#   --jobs N    run N targets at once (default 1; each uses one CPU)
#   --merge     afterwards, merge the inputs that add coverage into
#               tests/fuzz/corpus/<target>/ (libFuzzer -merge=1); without it the
#               checked-in corpus is never written to
#   --build DIR use this build tree, configured with -DTLSPROF_FUZZ=ON (CI passes
#               build-asan, which scripts/test-sanitizers.sh configures so)
#   --keep-going  run each target in libFuzzer's fork mode, which goes on after a
#               crash, leak, timeout or out-of-memory (-fork=1 -ignore_*=1), so one
#               run collects every finding it reaches (each input in crashes/)
#   --coverage  afterwards, replay each target's final corpus with
#               -print_coverage=1 and print, by project source file, the edges it
#               covers of the edges compiled into the target (all files:
#               <run>/<target>/coverage.txt)
#   --pick N    fuzz only N of the targets: the next N in the list each hour
#               (hours since the epoch), so that successive runs cover them all
#               while the pass takes the time of N (every run still replays every
#               corpus: the fuzz_replay_* tests)
#
# A <name>_large target is <name>'s harness on sparse 6 GiB input files
# (tests/fuzz/README.md): it starts from <name>'s corpus plus its own, and runs
# under -malloc_limit_mb=256, so an allocation sized by a header is a finding.
#
# Without --build: configures build-fuzz/ (CC=clang CXX=clang++ -DTLSPROF_FUZZ=ON)
# if it does not exist. Builds the targets. Each run works on a copy of the corpus
# in <build>/fuzz-runs/<time>/<target>/ (corpus/, crashes/, log).
# Reproduce a crash: <build>/bin/<target>_fuzz <crash file>.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all_targets=(elf_symbols go_pclntab eh_frame debuglink proc_maps collector_ingest elf_functions probe_plan
  boringssl_plan go_plan accessors archive_match collector_state spool_batch elf_symbols_large eh_frame_large
  elf_functions_large go_plan_large archive_match_large)

jobs=1
merge=0
pick=0
keep_going=0
coverage=0
build=
seconds=600
seen_seconds=0
targets=()
while (($#)); do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --jobs=*) jobs=${1#--jobs=}; shift ;;
    --merge) merge=1; shift ;;
    --pick) pick=$2; shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --coverage) coverage=1; shift ;;
    --build) build=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *)
      if [[ $1 =~ ^[0-9]+$ && ${#targets[@]} -eq 0 && $seen_seconds -eq 0 ]]; then
        seconds=$1
        seen_seconds=1
      else
        t=${1%_fuzz}
        if [[ ! " ${all_targets[*]} " =~ " $t " ]]; then
          echo "unknown target '$1'; targets: ${all_targets[*]}" >&2
          exit 2
        fi
        targets+=("$t")
      fi
      shift ;;
  esac
done
((${#targets[@]})) || targets=("${all_targets[@]}")
if ((pick > 0 && pick < ${#targets[@]})); then
  hour=$(($(date +%s) / 3600))
  from=$((hour * pick % ${#targets[@]}))
  picked=()
  for ((i = 0; i < pick; i++)); do picked+=("${targets[(from + i) % ${#targets[@]}]}"); done
  echo "picked ${picked[*]} (--pick $pick of ${#targets[@]}, this hour's turn)"
  targets=("${picked[@]}")
fi

if [[ -n $build ]]; then
  if ! grep -q '^TLSPROF_FUZZ:BOOL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "$build is not a build tree configured with -DTLSPROF_FUZZ=ON (clang); omit --build to use build-fuzz/" >&2
    exit 2
  fi
else
  build=$root/build-fuzz
fi
if [[ ! -f $build/CMakeCache.txt ]]; then
  echo "configuring $build (clang, TLSPROF_FUZZ=ON)"
  # -O1 -g1, as libFuzzer's documentation builds its targets: as fast to fuzz, quicker to compile, and crash
  # reports keep file and line.
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTLSPROF_FUZZ=ON \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
fi
if ! cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzz}" >"$build/fuzz-build.log" 2>&1; then
  tail -30 "$build/fuzz-build.log" >&2
  echo "building the fuzz targets failed (log: $build/fuzz-build.log)" >&2
  exit 1
fi

runs=$build/fuzz-runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$runs"
# halt_on_error: UBSan findings stop the run like crashes (the build also
# passes -fno-sanitize-recover). The leak check stays on (libFuzzer's default).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0}

# The corpus directories a target starts from (and its replay test reads): its own, and for a _large target
# its base target's first.
corpora() {
  local t=$1
  if [[ $t == *_large ]]; then echo "$root/tests/fuzz/corpus/${t%_large}"; fi
  [[ -d $root/tests/fuzz/corpus/$t ]] && echo "$root/tests/fuzz/corpus/$t"
  return 0
}

# libFuzzer's resource limits for a target (tests/fuzz/CMakeLists.txt passes the same to its replay test).
limits() {
  if [[ $1 == *_large ]]; then echo -rss_limit_mb=2048 -malloc_limit_mb=256; else echo -rss_limit_mb=2048; fi
}

run_one() {
  local t=$1 dir=$runs/$1 c
  mkdir -p "$dir/corpus" "$dir/crashes"
  for c in $(corpora "$t"); do cp -r "$c/." "$dir/corpus/"; done
  local start=$SECONDS mode=()
  ((keep_going)) && mode=(-fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
  # GNU time's peak RSS counts the fork mode's jobs too (the largest process).
  # shellcheck disable=SC2046 # limits() prints separate flags
  /usr/bin/time -f %M -o "$dir/maxrss_kb" "$build/bin/${t}_fuzz" "${mode[@]}" -max_total_time="$seconds" \
    $(limits "$t") -timeout=10 -print_final_stats=1 -artifact_prefix="$dir/crashes/" "$dir/corpus" >"$dir/log" 2>&1 ||
    true
  echo $((SECONDS - start)) >"$dir/seconds"
}

echo "fuzzing ${targets[*]} for ${seconds} s each, $jobs at a time; logs in $runs"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
printf '%-18s %6s %12s %9s %8s %8s %7s %8s %7s\n' target secs runs exec/s cov ft corpus rss_mb crashes
for t in "${targets[@]}"; do
  dir=$runs/$t
  stat() { sed -n "s/^stat::$1: *//p" "$dir/log" | tail -1; }
  # The last status line that carries coverage, e.g. "#123 DONE cov: 1234 ft: 5678 corp: 90/1Mb ...".
  last=$(grep -E '^#[0-9]+.*cov: ' "$dir/log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  # libFuzzer keeps inputs slower than -report_slow_units (10 s) as slow-unit-*: noted, not a finding (a unit past
  # -timeout is one, timeout-*).
  crashes=$(find "$dir/crashes" -type f ! -name 'slow-unit-*' | wc -l)
  slow=$(find "$dir/crashes" -type f -name 'slow-unit-*' | wc -l)
  # The fork mode (--keep-going) prints no final stats: "#123: cov: 1 ft: 2 corp: 3 exec/s 4 ...".
  runs_n=$(stat number_of_executed_units)
  exec_s=$(stat average_exec_per_sec)
  [[ -n $runs_n ]] || runs_n=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  # (its exec/s is the last job's rate: the average is runs over seconds)
  [[ -n $exec_s || -z $runs_n ]] || exec_s=$((runs_n / $(cat "$dir/seconds")))
  rss=$(($(tail -1 "$dir/maxrss_kb" 2>/dev/null || echo 0) / 1024))  # after "Command exited with ..."
  printf '%-18s %6s %12s %9s %8s %8s %7s %8s %7s\n' "$t" "$(cat "$dir/seconds")" "${runs_n:-?}" "${exec_s:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$rss" "$crashes"
  ((slow == 0)) || echo "  $t: $slow slow unit(s) kept in $dir/crashes (over 10 s, under the timeout)"
  if ((crashes)) || grep -qE '^==[0-9]+==ERROR|runtime error:|^SUMMARY: ' "$dir/log"; then
    status=1
    echo "  FINDING in $t (log: $dir/log):" >&2
    grep -E '^==[0-9]+==ERROR|runtime error:|^SUMMARY: ' "$dir/log" | head -3 | sed 's/^/    /' >&2
    find "$dir/crashes" -type f ! -name 'slow-unit-*' | sed 's/^/    input: /' >&2
  fi
done

# Edge coverage of the final corpus by project source file (not tests/, not generated code), largest files first.
if ((coverage)); then
  for t in "${targets[@]}"; do
    dir=$runs/$t
    # shellcheck disable=SC2046
    "$build/bin/${t}_fuzz" -runs=0 -print_coverage=1 $(limits "$t") -timeout=10 "$dir/corpus" 2>&1 |
      awk -v root="$root/" '/^(UN)?COVERED_FUNC: / {
          file = $NF; sub(/:[0-9]+$/, "", file)
          if (index(file, root) != 1) next
          file = substr(file, length(root) + 1)
          if (file ~ /^(tests|build[^\/]*)\//) next
          split($5, e, "/"); covered[file] += e[1]; total[file] += e[2]
        }
        END { for (f in total) printf "%6d %6d %5.1f%% %s\n", covered[f], total[f], total[f] ? 100 * covered[f] / total[f] : 0, f }' |
      sort -k2,2nr >"$dir/coverage.txt" || true
    echo "$t: edges covered of the edges compiled in, by file (largest 6; all in $dir/coverage.txt):"
    head -6 "$dir/coverage.txt" | awk '{ printf "    %-50s %6d / %-6d %s\n", $4, $1, $2, $3 }'
  done
fi

if ((merge)); then
  for t in "${targets[@]}"; do
    dest=$root/tests/fuzz/corpus/$t
    mkdir -p "$dest"
    before=$(find "$dest" -type f | wc -l)
    if [[ $t == *_large ]]; then
      # Merged into an empty directory against both corpora; only what neither holds is added to the target's own
      # (libFuzzer names merged files by the SHA-1 of their bytes).
      merged=$runs/$t/merged
      mkdir -p "$merged"
      # shellcheck disable=SC2046
      "$build/bin/${t}_fuzz" -merge=1 $(limits "$t") -timeout=10 "$merged" $(corpora "$t") "$runs/$t/corpus" \
        >"$runs/$t/merge.log" 2>&1
      known=$(for c in $(corpora "$t"); do find "$c" -type f -exec sha1sum {} +; done | cut -d' ' -f1)
      for f in "$merged"/*; do
        [[ -f $f ]] || continue
        grep -qx "$(sha1sum "$f" | cut -d' ' -f1)" <<<"$known" || cp "$f" "$dest/"
      done
    else
      # shellcheck disable=SC2046
      "$build/bin/${t}_fuzz" -merge=1 $(limits "$t") -timeout=10 "$dest" "$runs/$t/corpus" >"$runs/$t/merge.log" 2>&1
    fi
    after=$(find "$dest" -type f | wc -l)
    echo "merged into tests/fuzz/corpus/$t: $before -> $after files"
  done
fi
exit $status
