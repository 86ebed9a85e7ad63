#!/usr/bin/env python3
"""The end of scripts/test.sh: the slowest tests, each pass's time and outcome, and a check, from ctest's own logs,
that no two tests holding the CPU lock ever ran at the same time.

Usage: scripts/test-summary.py LOG_DIR   (build/test-logs: passes.tsv and one <pass>.log per stage)
Exits non-zero if two CPU-locked tests overlapped or a log cannot be read.
"""
import json
import os
import re
import subprocess
import sys

SLOWEST = 15
# The lock that tests measuring CPU hold (tests/CMakeLists.txt, cmake/TlsprofTest.cmake).
CPU_LOCK = "tlsprof_cpu"
# Which build directory each ctest pass ran in, to read the tests' properties.
PASS_BUILD = {"release": "build", "asan": "build-asan"}

START = re.compile(r"^\s*Start\s+\d+: (\S+)$")
END = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(?:\*\*\*)?(.*?)\s+([\d.]+) sec$")


def locked_tests(build_dir):
    """The tests of build_dir that hold CPU_LOCK, from CTest's own description of them."""
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, capture_output=True, text=True, check=True)
    names = set()
    for test in json.loads(out.stdout)["tests"]:
        for prop in test.get("properties", []):
            if prop["name"] == "RESOURCE_LOCK" and CPU_LOCK in prop["value"]:
                names.add(test["name"])
    return names


# Lines of a failed test's output that say why (unittest, GoogleTest, the
# accuracy tables' marks), printed again at the end: CI shows the head and the
# tail of a long log, and a failure's reason sits in the middle.
WHY = re.compile(r"^(FAIL|ERROR): |AssertionError|<-- over|over the .* limit|^\S+:\d+: Failure|"
                 r"^\s*(Expected|Which is|Value of|  Actual)|Timeout|Segmentation|Exception")
WHY_LINES = 12


def read_pass(path):
    """([(event, test, line_no, outcome, seconds)] in log order, {test: up to WHY_LINES lines of its output that
    say why it failed}); event is 'start' or 'end'. ctest prints a test's output after its end line."""
    events, reasons = [], {}
    output_of = None
    with open(path, errors="replace") as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if m := START.match(line):
                events.append(("start", m.group(1), no, None, None))
                output_of = None
            elif m := END.match(line):
                events.append(("end", m.group(1), no, m.group(2).strip(), float(m.group(3))))
                output_of = m.group(1)
            elif output_of and WHY.search(line):
                why = reasons.setdefault(output_of, [])
                if line.strip()[:200] not in why and len(why) < WHY_LINES:
                    why.append(line.strip()[:200])
    return events, reasons


def check_lock(name, events, locked):
    """Prints each locked test's span in the log; returns False if two spans overlap."""
    running = {}
    spans = []
    ok = True
    for event, test, no, _, _ in events:
        if test not in locked:
            continue
        if event == "start":
            if running:
                print(f"  OVERLAP in {name}: {test} started (log line {no}) while {', '.join(running)} ran")
                ok = False
            running[test] = no
        else:
            spans.append((running.pop(test, 0), no, test))
    print(f"{name}: {len(spans)} CPU-measuring tests (RESOURCE_LOCK {CPU_LOCK}), "
          f"{'none overlapped' if ok else 'OVERLAPPED'}; span in ctest's log (start line-end line):")
    for start, end, test in sorted(spans):
        print(f"  {start:>5}-{end:<5} {test}")
    return ok


# Stages that run in the background beside another (scripts/test.sh): their
# time is not added to the total.
BESIDE = {"trixie": "the build", "systemd-root": "the build"}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    logs = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    passes = []
    with open(os.path.join(logs, "passes.tsv")) as f:
        for line in f:
            stage, seconds, rc = line.rstrip("\n").split("\t")
            passes.append((stage, int(seconds), int(rc)))

    results = []
    reasons = {}
    ok = True
    print("\n==== test summary")
    for stage, _, _ in passes:
        path = os.path.join(logs, f"{stage}.log")
        events, reasons[stage] = read_pass(path) if os.path.exists(path) else ([], {})
        ends = [e for e in events if e[0] == "end"]
        if not ends:
            continue
        results += [(seconds, stage, test, outcome) for _, test, _, outcome, seconds in ends]
        build = os.path.join(root, PASS_BUILD.get(stage, "build"))
        if os.path.isdir(build):
            ok &= check_lock(stage, events, locked_tests(build))

    print(f"\nslowest {SLOWEST} tests:")
    print(f"  {'seconds':>8}  {'pass':<8} {'outcome':<8} test")
    for seconds, stage, test, outcome in sorted(results, reverse=True)[:SLOWEST]:
        print(f"  {seconds:>8.1f}  {stage:<8} {outcome:<8} {test}")
    failed = [(stage, test, outcome) for _, stage, test, outcome in results if outcome != "Passed"]
    if failed:
        print("\nfailed tests:")
        for stage, test, outcome in failed:
            print(f"  {stage:<8} {outcome:<10} {test}")
            for reason in reasons.get(stage, {}).get(test, []):
                print(f"      {reason}")

    print("\npasses:")
    total = 0
    for stage, seconds, rc in passes:
        tests = sum(1 for r in results if r[1] == stage)
        what = f"{tests} tests" if tests else ""
        if stage in BESIDE:
            what = f"beside {BESIDE[stage]}, not in the total"
        else:
            total += seconds
        print(f"  {stage:<8} {seconds // 60:>3} min {seconds % 60:02d} s  {'ok' if rc == 0 else f'FAILED ({rc})':<11} {what}")
    print(f"  {'total':<8} {total // 60:>3} min {total % 60:02d} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
