#!/usr/bin/env python3
"""Holds the agent to its contract for files other processes control
(agent/guard/guarded_file.h): outside agent/guard/, no source opens, maps
or hands to libelf/libdw a file by itself.

Flagged in agent/**/*.{cc,h} (tests, test helpers and test data excepted):
opening a path (open, openat, fopen, std::ifstream), mapping (mmap), and
driving libelf/libdw directly (elf_begin, elf_memory, elf_rawfile,
ELF_C_READ_MMAP, elf_getdata, elf_rawdata, elf_strptr, elf_compress,
dwarf_begin, dwarf_begin_elf). A line that must do one of these on a file
the agent itself owns (its state directory, /proc/self, the operator's
files) says so with a `// guarded-io: <why>` comment on that line.

Usage: scripts/check-guarded-io.py [ROOT]   (exit 1 and a list when flagged)
"""
import os
import re
import sys

PATTERNS = [
    (re.compile(r"(?<![\w.>:])(?:::)?open(?:at)?\s*\("), "opens a path"),
    (re.compile(r"\bfopen\s*\("), "opens a path"),
    (re.compile(r"\bstd::ifstream\b"), "opens a path"),
    (re.compile(r"(?<![\w.>])mmap\s*\("), "maps a file"),
    (re.compile(r"\b(elf_begin|elf_memory|elf_rawfile|elf_getdata|elf_rawdata|elf_strptr|elf_compress)\s*\("),
     "drives libelf itself (use guard::ElfFile)"),
    (re.compile(r"\bELF_C_READ_MMAP\b"), "maps an ELF file"),
    (re.compile(r"\bdwarf_begin(_elf)?\s*\("), "hands a file to libdw"),
]
MARKER = "guarded-io:"


def exempt(rel):
    base = os.path.basename(rel)
    return (rel.startswith("agent/guard/") or "/testdata/" in rel or base.endswith("_test.cc")
            or base.startswith("test_") or "test_util" in base or base.endswith("_test_util.h")
            or base.endswith("_test_chains.cc") or base.endswith("_test_chains.h")
            or base in ("plan_test_util.h", "forked_child_test_util.h", "test_collector.h")
            # Tools and the reference builder that only tests and tools link.
            or base in ("symbols_loadcheck.cc", "unwind_tablecheck.cc", "reference_table.cc", "reference_table.h"))


def strip_comment(line):
    # Enough for this code base: no "//" inside the string literals flagged.
    at = line.find("//")
    return line if at < 0 else line[:at]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    found = []
    checked = 0
    for dirpath, _, files in os.walk(os.path.join(root, "agent")):
        for name in sorted(files):
            if not name.endswith((".cc", ".h")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if exempt(rel):
                continue
            checked += 1
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if MARKER in line:
                        continue
                    code = strip_comment(line)
                    whats = [what for pattern, what in PATTERNS if pattern.search(code)]
                    if whats:
                        found.append(f"{rel}:{n}: {'; '.join(dict.fromkeys(whats))}: {line.strip()}")
    print(f"checked {checked} agent sources")
    if found:
        print("Files other processes control are opened only through agent/guard (guarded_file.h, elf_file.h).")
        print("For a file the agent owns, say so on the line: // guarded-io: <why>")
        print("\n".join(found))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
