#!/usr/bin/env bash
# What naming a stripped TLS library from its own tables costs at discovery
# (agent/symbols/library_tables.h for OpenSSL 3, boringssl_tables.h for
# BoringSSL), side by side with the other symbol sources for the same file,
# all through tlsprof-symbols-loadcheck:
#   tables   ReadLibraryTables / ReadBoringSslTables alone, the fastest of
#            --repeat runs (the reader that names something in the file)
#   dynsym   LoadBinaryImage with .dynsym only (no archive, no tables)
#   +tables  LoadBinaryImage with .dynsym and the tables (a host without libssl-dev)
#   archive  LoadBinaryImage with libssl-dev's libcrypto.a (parse + match;
#            a BoringSSL has none, so this is its dynsym line again)
# Each LoadBinaryImage line is one cold run (a fresh process), repeated
# --repeat times; the fastest is printed, with the ratio to `dynsym`.
#
# Usage: bench/library_tables.sh [--build DIR] [--repeat N] [LIBRARY...]
#   (default LIBRARY: Debian's /usr/lib/x86_64-linux-gnu/libcrypto.so.3 and
#   android-libboringssl's /usr/lib/x86_64-linux-gnu/android/libcrypto.so.0)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
repeat=10
libs=()
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) libs+=("$1"); shift ;;
  esac
done
((${#libs[@]})) || libs=(/usr/lib/x86_64-linux-gnu/libcrypto.so.3 /usr/lib/x86_64-linux-gnu/android/libcrypto.so.0)
check="$build/bin/tlsprof-symbols-loadcheck"
[[ -x $check ]] || check=$(find "$build" -name tlsprof-symbols-loadcheck -type f -perm -u+x | head -1)
if [[ -z $check || ! -x $check ]]; then
  echo "tlsprof-symbols-loadcheck is not built in $build: run scripts/build.sh" >&2
  exit 1
fi

fastest() {  # fastest "load time X ms" of $repeat cold runs of: loadcheck ARGS
  local best= t
  for ((i = 0; i < repeat; i++)); do
    t=$("$check" "$@" | sed -n 's/^load time \([0-9.]*\) ms$/\1/p')
    [[ -n $t ]] || { echo "loadcheck $* printed no load time" >&2; exit 1; }
    if [[ -z $best ]] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
  done
  echo "$best"
}

for lib in "${libs[@]}"; do
  echo "== $lib"
  "$check" "$lib" --tables-only --repeat "$repeat"
  dyn=$(fastest "$lib" --all --no-archive --no-tables)
  tab=$(fastest "$lib" --all --no-archive)
  arc=$(fastest "$lib" --all --no-tables)
  printf '%-9s %9s %9s\n' source "load ms" "x dynsym"
  for row in "dynsym $dyn" "+tables $tab" "archive $arc"; do
    set -- $row
    printf '%-9s %9.1f %9.2f\n' "$1" "$2" "$(awk -v a="$2" -v b="$dyn" 'BEGIN { print a / b }')"
  done
  "$check" "$lib" --all --no-archive | head -1
done
