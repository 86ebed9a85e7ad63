#!/usr/bin/env python3
"""check-ctest-costs.py BUILD_DIR COSTS_FILE [CTEST_ARG...]: fails when CTest
would not use the seeded test times of COSTS_FILE (tests/ctest-costs.txt or
tests/ctest-costs-sanitize.txt) for the tests of BUILD_DIR that CTEST_ARGS
select (the sanitizer pass: `-L '^(unit|bpf|asan)$'`).

CTest reads `name runs seconds` lines up to a line `---`; what follows it is
the list of tests that failed last, run first. A file sorted with `---` on
top gives CTest no time at all, and a test with no line starts after every
test that has one: either way a long test can start last and hold up the
pass (it did: the 160 s hostile test). Checks that every line before `---`
has three fields and a number, that `---` is there with nothing after it,
and that every selected test (`ctest --show-only=json-v1`) has a line.
Exit 1 with the offending lines or tests named; 0 and a one-line count
otherwise. Python 3 standard library only."""
import json
import subprocess
import sys


def read_costs(path):
    """(costs by test name, errors) of a CTest cost file."""
    costs, errors = {}, []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if "---" not in lines:
        return costs, [f"{path}: no `---` line (CTest reads costs up to it)"]
    end = lines.index("---")
    if end == 0:
        errors.append(f"{path}: `---` is the first line, so CTest reads no cost at all (is the file sorted?)")
    for n, line in enumerate(lines[:end], 1):
        parts = line.split()
        try:
            if len(parts) != 3:
                raise ValueError
            int(parts[1])
            costs[parts[0]] = float(parts[2])
        except ValueError:
            errors.append(f"{path}:{n}: `{line}` is not `name runs seconds`")
    after = [line for line in lines[end + 1:] if line.strip()]
    if after:
        errors.append(f"{path}: {len(after)} line(s) after `---` (CTest runs them first as failed last): {after[:3]}")
    return costs, errors


def main():
    if len(sys.argv) < 3:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    build, path, selection = sys.argv[1], sys.argv[2], sys.argv[3:]
    costs, errors = read_costs(path)
    shown = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", *selection], check=True,
                           capture_output=True, text=True).stdout
    tests = sorted(t["name"] for t in json.loads(shown)["tests"])
    missing = [t for t in tests if t not in costs]
    if missing:
        errors.append(f"{path}: no time for {len(missing)} test(s), which would start last: {', '.join(missing)} "
                      f"(their seconds from a clean-clone run: {build}/Testing/Temporary/CTestCostData.txt)")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f"{path}: a time for each of the {len(tests)} tests of {build}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
