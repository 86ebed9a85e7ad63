#!/usr/bin/env python3
"""Prints the longest C++ functions under the given folders and fails when one
is over the limit. Function extents come from universal-ctags (Debian's
universal-ctags: `end:` field); a function's lambdas count as its lines.

  scripts/function-lengths.py [--limit 120] [--top 10] DIR...
"""
import argparse
import os
import subprocess
import sys


def functions(paths):
    files = []
    for root in paths:
        for dirpath, _, names in os.walk(root):
            files += [os.path.join(dirpath, n) for n in names if n.endswith((".cc", ".h", ".c"))]
    if not files:
        sys.exit(f"function-lengths: no C/C++ files under {' '.join(paths)}")
    out = subprocess.run(["ctags", "--fields=+ne", "--c++-kinds=f", "--c-kinds=f", "--extras=+q", "-o", "-",
                          *sorted(files)], check=True, capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines():
        parts = line.split("\t")
        fields = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        if "line" not in fields or "end" not in fields:
            continue
        start, end = int(fields["line"]), int(fields["end"])
        scope = fields.get("class") or fields.get("struct") or ""
        name = f"{scope}::{parts[0]}" if scope and "::" not in parts[0] else parts[0]
        key = (parts[1], start)
        # --extras=+q lists a member twice (plain and qualified): keep the qualified name.
        if key not in seen or "::" in name:
            seen[key] = (end - start + 1, parts[1], start, name)
    return sorted(seen.values(), key=lambda r: (-r[0], r[1], r[2]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    rows = functions(args.dirs)
    print(f"the {args.top} longest of {len(rows)} functions under {' '.join(args.dirs)}:")
    for lines, path, start, name in rows[:args.top]:
        print(f"{lines:5d}  {path}:{start}  {name}")
    over = [r for r in rows if r[0] > args.limit]
    if over:
        print(f"{len(over)} functions are over {args.limit} lines:", file=sys.stderr)
        for lines, path, start, name in over:
            print(f"{lines:5d}  {path}:{start}  {name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
