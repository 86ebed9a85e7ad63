#!/usr/bin/env bash
# Fails if any C/C++ source differs from .clang-format. Fix with --fix.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' | grep -v '^bpf/vmlinux')
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "format: $f differs from .clang-format (run scripts/check-format.sh --fix)" >&2
    bad=1
  fi
done
exit $bad
