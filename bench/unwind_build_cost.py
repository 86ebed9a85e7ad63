#!/usr/bin/env python3
"""unwind_build_cost.py: what does building one file's unwind table cost, with
the agent's own CFI interpreter against the reference builder (libdw's
interpreter, one dwarf_cfi_addrframe call per row)?

For each file it runs `tlsprof-unwind-tablecheck --compare` (which builds the
table with both, checks they are the same row for row, and prints both times)
--repeat times and prints the medians side by side with their ratio. The
files: Debian's libcrypto.so.3, node, and two files written here, each one
FDE of alternating advance_loc/def_cfa_offset rows: 60,000 rows (under
guard::kMaxRowsPerFde: both builders make every row) and 200,000 rows (the
agent cuts it at the cap; the reference, whose cost is quadratic in the rows,
is run once for it, with --slow-timeout).

Holds /tmp/tlsprof-measure.lock while it measures and prints the load
average before and after: the machine is shared. Python 3 standard library
only; no root needed.

    python3 bench/unwind_build_cost.py [--bin build/bin] [--repeat 5]
        [--slow-timeout 900] [--skip-slow]
"""

import argparse
import fcntl
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile

LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"
NODE = "/usr/bin/node"
TEXT = 0x10000


def elf_with_eh_frame(eh_frame, text_size):
    """A minimal x86-64 ELF64: one PT_LOAD R+X segment, .eh_frame, .shstrtab."""
    shstr = b"\0.eh_frame\0.shstrtab\0"
    f = bytearray(64 + 56)
    offs = []
    for data in (b"", eh_frame, shstr):
        while len(f) % 8:
            f += b"\0"
        offs.append(len(f))
        f += data
    while len(f) % 8:
        f += b"\0"
    shoff = len(f)
    f += struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    f += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0x400000, offs[1], len(eh_frame), 0, 0, 8, 0)
    f += struct.pack("<IIQQQQIIQQ", 11, 3, 0, 0, offs[2], len(shstr), 0, 0, 1, 0)
    f[0:16] = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    struct.pack_into("<HHIQQQIHHHHHH", f, 16, 2, 62, 1, TEXT, 64, shoff, 0, 64, 56, 1, 64, 3, 2)
    struct.pack_into("<IIQQQQQQ", f, 64, 1, 5, 0, TEXT, TEXT, 0, text_size, 0x1000)
    return bytes(f)


def long_fde_file(path, rows):
    """One CIE (CFA = RSP + 8, RA at CFA - 8) and one FDE of `rows` rows."""
    cie = struct.pack("<IBB", 0, 1, 0) + b"\x01\x78\x10" + b"\x0c\x07\x08\x90\x01"
    program = b"".join(b"\x41\x0e" + bytes([16 + 8 * (i % 2)]) for i in range(rows))
    fde_body = struct.pack("<I", 4 + len(cie) + 4) + struct.pack("<QQ", TEXT, rows + 1) + program
    eh = struct.pack("<I", len(cie)) + cie + struct.pack("<I", len(fde_body)) + fde_body + b"\0" * 4
    with open(path, "wb") as f:
        f.write(elf_with_eh_frame(eh, rows + 16))


LINE = re.compile(r"build time reference ([0-9.]+) ms, agent ([0-9.]+) ms")


def compare(tablecheck, path, timeout):
    """(reference ms, agent ms, same rows) of one --compare run."""
    p = subprocess.run([tablecheck, "--compare", path], capture_output=True, text=True, timeout=timeout)
    m = LINE.search(p.stdout)
    if not m:
        raise SystemExit(f"{path}: tablecheck printed no times (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    return float(m.group(1)), float(m.group(2)), "same rows" in p.stdout


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--slow-timeout", type=int, default=900, help="seconds for the reference on 200,000 rows")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the 200,000-row file")
    args = ap.parse_args()
    tablecheck = os.path.join(args.bin, "tlsprof-unwind-tablecheck")
    if not os.access(tablecheck, os.X_OK):
        raise SystemExit(f"{tablecheck} is missing: cmake --build build --target tlsprof-unwind-tablecheck")

    with tempfile.TemporaryDirectory(prefix="tlsprof-unwind-build-") as tmp:
        fde60k = os.path.join(tmp, "fde-60000-rows")
        fde200k = os.path.join(tmp, "fde-200000-rows")
        long_fde_file(fde60k, 60_000)
        long_fde_file(fde200k, 200_000)
        files = [("libcrypto.so.3", LIBCRYPTO, args.repeat), ("node", NODE, args.repeat),
                 ("one FDE, 60,000 rows", fde60k, args.repeat)]
        if not args.skip_slow:
            files.append(("one FDE, 200,000 rows (agent: cut at 65,536)", fde200k, 1))

        with open("/tmp/tlsprof-measure.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            before = load_average()
            results = []
            for name, path, repeat in files:
                runs = [compare(tablecheck, path, args.slow_timeout if repeat == 1 else 300) for _ in range(repeat)]
                results.append((name, runs))
                print(f"  {name}: {len(runs)} run(s) done", file=sys.stderr)
            after = load_average()

    print("$ python3 " + " ".join(sys.argv))
    print(f"load average before {before}, after {after} (2 vCPUs, shared with other engineers)")
    print(f"{'file':<48} {'runs':>4} {'reference ms':>13} {'agent ms':>10} {'ratio':>8}  rows")
    for name, runs in results:
        ref = statistics.median(r[0] for r in runs)
        agent = statistics.median(r[1] for r in runs)
        same = all(r[2] for r in runs)
        rows = "same" if same else "differ (cap)" if "cut" in name else "DIFFER"
        print(f"{name:<48} {len(runs):>4} {ref:>13.1f} {agent:>10.1f} {ref / agent if agent else 0:>7.1f}x  {rows}")
    print("medians of --repeat runs (one run of the reference for 200,000 rows)")


if __name__ == "__main__":
    main()
