#!/usr/bin/env python3
"""Builds the seed corpora of tests/fuzz/corpus/<target>/ (see README.md).

Every seed is made here from something real and small: tiny C programs and
libraries compiled with the system's gcc and split with binutils, the
.gopclntab of a tiny Go program built with the system's Go, Go pclntab layouts
as the Go runtime defines them (runtime/symtab.go), /proc text as this
kernel writes it, and collector requests encoded by protoc from text format.

Usage: tests/fuzz/make_corpus.py [--out DIR]   (default: tests/fuzz/corpus)

Seeds are named seed-*; inputs kept from fuzzing (crash-*, and what
bench/fuzz.sh --merge adds) are left alone. Rerunning rewrites the seeds; the
compilers' output may differ by a few bytes between machines, which is fine.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGETS = ["elf_symbols", "go_pclntab", "eh_frame", "debuglink", "proc_maps", "collector_ingest"]


def run(*cmd, cwd=None, stdin=None):
    r = subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr.decode(errors='replace')}")
    return r.stdout


def read(path):
    with open(path, "rb") as f:
        return f.read()


# --- tiny native binaries ------------------------------------------------

HELLO_C = r"""
#include <stdio.h>
#include <string.h>
static int helper(int x) { return x * 3 + 1; }
int fuzz_entry(int argc) { return helper(argc) + (int)strlen("tls"); }
int main(int argc, char** argv) { (void)argv; printf("%d\n", fuzz_entry(argc)); return 0; }
"""

LIB_C = r"""
#include <stdlib.h>
#include <string.h>
/* Calls through the PLT (import_calls), a few symbols of different sizes. */
int SSL_write(void* ssl, const void* buf, int n) { (void)ssl; return n + (int)strlen((const char*)buf); }
static long mix(long a, long b) { return (a << 5) ^ (b >> 3); }
long EVP_fuzz(long a, long b) { char* p = malloc(16); long r = mix(a, b) + (p != 0); free(p); return r; }
"""

# Frames of every CFA rule kind the row builder models, and some it does not:
# push/pop (CFA_RSP), a frame-pointer function (CFA_RBP), a CFA in another
# register (CFA_REG), a DW_CFA_def_cfa_expression (unsupported), the return
# address saved away from CFA-8 (unsupported), and a function without CFI.
CFI_S = r"""
  .text
  .globl push_pop
  .type push_pop, @function
push_pop:
  .cfi_startproc
  push %rbx
  .cfi_adjust_cfa_offset 8
  .cfi_offset %rbx, -16
  sub $24, %rsp
  .cfi_adjust_cfa_offset 24
  add $24, %rsp
  .cfi_adjust_cfa_offset -24
  pop %rbx
  .cfi_adjust_cfa_offset -8
  ret
  .cfi_endproc
  .size push_pop, .-push_pop

  .globl frame_pointer
  .type frame_pointer, @function
frame_pointer:
  .cfi_startproc
  push %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  mov %rsp, %rbp
  .cfi_def_cfa_register %rbp
  nop
  leave
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size frame_pointer, .-frame_pointer

  .globl other_reg
  .type other_reg, @function
other_reg:
  .cfi_startproc
  mov %rsp, %r10
  .cfi_def_cfa_register %r10
  and $-64, %rsp
  mov %r10, %rsp
  .cfi_def_cfa_register %rsp
  ret
  .cfi_endproc
  .size other_reg, .-other_reg

  .globl cfa_expr
  .type cfa_expr, @function
cfa_expr:
  .cfi_startproc
  /* DW_CFA_def_cfa_expression: DW_OP_breg7 (rsp) 8; DW_OP_deref */
  .cfi_escape 0x0f, 0x03, 0x77, 0x08, 0x06
  nop
  .cfi_def_cfa %rsp, 8
  ret
  .cfi_endproc
  .size cfa_expr, .-cfa_expr

  .globl ra_elsewhere
  .type ra_elsewhere, @function
ra_elsewhere:
  .cfi_startproc
  .cfi_return_column 16
  .cfi_offset 16, -24
  ret
  .cfi_endproc
  .size ra_elsewhere, .-ra_elsewhere

  .globl no_cfi
  .type no_cfi, @function
no_cfi:
  ret
  .size no_cfi, .-no_cfi
  .section .note.GNU-stack,"",@progbits
"""

# OpenSSL 3's provider tables in miniature (agent/symbols/library_tables.h;
# library_tables_test builds the same file): stripped, only these tables name
# its functions.
PROVIDER_C = os.path.join(ROOT, "agent", "symbols", "testdata", "provider_tables.c")
# BoringSSL's method structs in miniature (agent/symbols/boringssl_tables.h;
# boringssl_tables_test builds the same file): getters, once-inits and a
# curve table, decoded from the machine code.
BORINGSSL_C = os.path.join(ROOT, "agent", "symbols", "testdata", "boringssl_methods.c")

SMALL = ["-Os", "-Wl,-z,noseparate-code", "-Wl,-z,norelro", "-Wl,--hash-style=gnu"]


def build_native(tmp):
    """Returns a dict of name -> path of small real ELF files."""
    out = {}
    src = os.path.join(tmp, "hello.c")
    with open(src, "w") as f:
        f.write(HELLO_C)
    lib = os.path.join(tmp, "lib.c")
    with open(lib, "w") as f:
        f.write(LIB_C)
    asm = os.path.join(tmp, "cfi.S")
    with open(asm, "w") as f:
        f.write(CFI_S)
    prov = PROVIDER_C

    def p(name):
        return os.path.join(tmp, name)

    run("gcc", *SMALL, "-Wl,--build-id", "-o", p("hello"), src)
    run("gcc", *SMALL, "-Wl,--build-id", "-no-pie", "-fno-pie", "-o", p("hello-nopie"), src)
    run("gcc", *SMALL, "-Wl,--build-id", "-shared", "-fPIC", "-Wl,-soname,libfuzz.so.1", "-o", p("libfuzz.so"), lib)
    run("gcc", "-c", "-Os", "-o", p("lib.o"), lib)
    run("gcc", *SMALL, "-Wl,--build-id", "-shared", "-nostdlib", "-o", p("libcfi.so"), asm)
    run("gcc", *SMALL, "-Wl,--build-id", "-shared", "-fPIC", "-Wl,-soname,libprov.so.1", "-o", p("libprov.so"), prov)
    run("gcc", *SMALL, "-Wl,--build-id", "-shared", "-fPIC", "-Wl,-soname,libbssl.so.0", "-o", p("libbssl.so"),
        BORINGSSL_C, "-lpthread")
    # CFI only in .debug_frame (as in Go binaries and some assembly).
    run("gcc", *SMALL, "-g1", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-Wl,--build-id",
        "-o", p("hello-debug-frame"), src)
    run("objcopy", "-R", ".eh_frame", "-R", ".eh_frame_hdr", "-R", ".debug_info", "-R", ".debug_line",
        "-R", ".debug_str", "-R", ".debug_line_str", "-R", ".debug_abbrev", "-R", ".debug_aranges",
        "-R", ".debug_rnglists", p("hello-debug-frame"))
    for name in ["hello", "hello-nopie", "libfuzz.so", "lib.o", "libcfi.so", "hello-debug-frame"]:
        out[name] = p(name)
    # Stripped copies keep only .dynsym (and .eh_frame).
    for name in ["hello", "libfuzz.so", "libprov.so", "libbssl.so"]:
        run("strip", "--strip-all", "-o", p(name + ".stripped"), p(name))
        out[name + ".stripped"] = p(name + ".stripped")
    return out


# --- Go pclntab ----------------------------------------------------------

FUNCS = [(0x0, "runtime.text"), (0x40, "crypto/aes.encryptBlockAsm"), (0x100, "crypto/tls.(*Conn).Handshake"),
         (0x180, "runtime.goexit")]
END = 0x1c0
TEXT = 0x401000


def zigzag(v):
    return (v << 1) ^ (v >> 63) if v >= 0 else ((-v) << 1) - 1


def uvarint(v):
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pcsp_table(steps, quantum):
    """steps: [(sp_delta, length_in_bytes)], as runtime/symtab.go step() reads them."""
    out, value = bytearray(), -1
    for sp, length in steps:
        out += uvarint(zigzag(sp - value)) + uvarint(length // quantum)
        value = sp
    return bytes(out + b"\0")


class Table:
    def __init__(self, big_endian=False, ptr=8):
        self.b = bytearray()
        self.e = ">" if big_endian else "<"
        self.ptr = ptr

    def put(self, off, v, size):
        if len(self.b) < off + size:
            self.b += bytes(off + size - len(self.b))
        fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
        self.b[off:off + size] = struct.pack(self.e + fmt, v & ((1 << (8 * size)) - 1))

    def put_bytes(self, off, data):
        if len(self.b) < off + len(data):
            self.b += bytes(off + len(data) - len(self.b))
        self.b[off:off + len(data)] = data
        return off + len(data)


def go_table(magic, big_endian=False, ptr=8, quantum=1, text_start=TEXT):
    """A pclntab of FUNCS in the 1.16 (0xfffffffa), 1.18 (0xfffffff0) or 1.20
    (0xfffffff1) layout, with names, a functab, _func records and pcsp tables."""
    t = Table(big_endian, ptr)
    t.put(0, magic, 4)
    t.put(6, quantum, 1)
    t.put(7, ptr, 1)
    new = magic in (0xfffffff0, 0xfffffff1)
    nwords = 8 if new else 7
    names = 8 + nwords * ptr
    t.put(8, len(FUNCS), ptr)  # nfunc
    t.put(8 + ptr, 0, ptr)  # nfiles
    if new:
        t.put(8 + 2 * ptr, text_start, ptr)
    nameoffs, off = [], names
    for _, name in FUNCS:
        nameoffs.append(off - names)
        off = t.put_bytes(off, name.encode() + b"\0")
    pctab = off
    pcsp = []
    for i, (entry, _) in enumerate(FUNCS):
        end = FUNCS[i + 1][0] if i + 1 < len(FUNCS) else END
        size = end - entry
        steps = [(0, 4), (8, 4), (32, size - 12), (0, 4)] if size > 12 else [(0, size)]
        pcsp.append(off - pctab)
        off = t.put_bytes(off, pcsp_table(steps, quantum))
    pcln = (off + 7) & ~7
    first = 3 if new else 2  # funcnametab, cutab, filetab, pctab, pclntab words
    for i, v in enumerate([names, pcln, pcln, pctab, pcln]):
        t.put(8 + (first + i) * ptr, v, ptr)
    fs = 4 if new else ptr
    funcs = pcln + (len(FUNCS) + 1) * 2 * fs
    func_size = fs + 4 * 8 + 4
    base = 0 if new else text_start
    for i, (entry, _) in enumerate(FUNCS):
        funcoff = funcs + i * func_size - pcln
        t.put(pcln + i * 2 * fs, base + entry, fs)
        t.put(pcln + i * 2 * fs + fs, funcoff, fs)
        f = pcln + funcoff
        t.put(f, base + entry, fs)
        t.put(f + fs, nameoffs[i], 4)  # nameOff
        t.put(f + fs + 4, 0, 4)  # args
        t.put(f + fs + 8, 0, 4)  # deferreturn
        t.put(f + fs + 12, pcsp[i], 4)  # pcsp
        t.put_bytes(f + fs + 16, bytes(16))  # pcfile, pcln, npcdata, cuOffset + flags
    t.put(pcln + len(FUNCS) * 2 * fs, base + END, fs)
    return bytes(t.b)


def go_table_12(ptr=8):
    """The 1.2-1.15 layout (0xfffffffb): functab after the header, offsets from the table start."""
    t = Table(False, ptr)
    t.put(0, 0xfffffffb, 4)
    t.put(6, 1, 1)
    t.put(7, ptr, 1)
    t.put(8, len(FUNCS), ptr)
    functab = 8 + ptr
    funcs = functab + (len(FUNCS) + 1) * 2 * ptr + ptr
    func_size = ptr + 16
    off = funcs + len(FUNCS) * func_size
    for i, (entry, name) in enumerate(FUNCS):
        f = funcs + i * func_size
        t.put(functab + i * 2 * ptr, TEXT + entry, ptr)
        t.put(functab + i * 2 * ptr + ptr, f, ptr)
        t.put(f, TEXT + entry, ptr)
        t.put(f + ptr, off, 4)
        t.put_bytes(f + ptr + 4, bytes(12))
        off = t.put_bytes(off, name.encode() + b"\0")
    t.put(functab + len(FUNCS) * 2 * ptr, TEXT + END, ptr)
    return bytes(t.b)


def build_go(tmp):
    """The real .gopclntab of a tiny Go program (no fmt: about 250 KB)."""
    d = os.path.join(tmp, "go")
    os.makedirs(d)
    with open(os.path.join(d, "main.go"), "w") as f:
        f.write('package main\n\nfunc main() { println("tls") }\n')
    with open(os.path.join(d, "go.mod"), "w") as f:
        f.write("module tiny\n\ngo 1.19\n")
    env_cache = os.path.join(tmp, "gocache")
    r = subprocess.run(["go", "build", "-trimpath", "-ldflags=-s -buildid=", "-o", "tiny", "."], cwd=d,
                       capture_output=True, env=dict(os.environ, GOCACHE=env_cache, GOFLAGS="-mod=mod",
                                                     CGO_ENABLED="0"))
    if r.returncode != 0:
        sys.exit("go build failed:\n" + r.stderr.decode(errors="replace"))
    pcln = os.path.join(tmp, "tiny.gopclntab")
    run("objcopy", "-O", "binary", "--only-section=.gopclntab", os.path.join(d, "tiny"), pcln)
    return read(pcln)


# --- writers ---------------------------------------------------------------


def write(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def with_section(tmp, src, name, section, data, flags="alloc,readonly"):
    path = os.path.join(tmp, os.path.basename(src) + name)
    blob = os.path.join(tmp, name.strip(".") + ".bin")
    with open(blob, "wb") as f:
        f.write(data)
    run("objcopy", "--add-section", f"{section}={blob}", "--set-section-flags", f"{section}={flags}", src, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    args = ap.parse_args()
    for t in TARGETS:
        d = os.path.join(args.out, t)
        if os.path.isdir(d):
            for f in os.listdir(d):
                if f.startswith("seed-"):
                    os.remove(os.path.join(d, f))

    with tempfile.TemporaryDirectory(prefix="tlsprof-corpus-") as tmp:
        elf = build_native(tmp)
        tables = {
            "go118": go_table(0xfffffff0),
            "go120": go_table(0xfffffff1),
            "go120-pie": go_table(0xfffffff1, text_start=0),
            "go116": go_table(0xfffffffa),
            "go118-be-ptr4-q4": go_table(0xfffffff0, big_endian=True, ptr=4, quantum=4),
            "go12": go_table_12(),
        }
        real = build_go(tmp)

        # ELF symbol tables.
        for name in ["hello", "hello-nopie", "libfuzz.so", "lib.o", "hello.stripped", "libfuzz.so.stripped",
                     "libcfi.so", "libprov.so.stripped", "libbssl.so.stripped"]:
            write(args.out, "elf_symbols", name, read(elf[name]))
        # A stripped binary whose names come from a .gopclntab.
        go_elf = with_section(tmp, elf["hello.stripped"], ".go", ".gopclntab", tables["go120-pie"])
        write(args.out, "elf_symbols", "stripped-gopclntab", read(go_elf))
        # ... and one where it hides inside .data.rel.ro (external linking), after some bytes.
        # (.go.buildinfo marks a binary as Go, which is what enables the search by magic.)
        hidden = with_section(tmp, elf["hello.stripped"], ".relro", ".data.rel.ro", bytes(24) + tables["go118"])
        hidden = with_section(tmp, hidden, ".bi", ".go.buildinfo", b"\xff Go buildinf:\x08\x02" + bytes(16))
        write(args.out, "elf_symbols", "stripped-relro-gopclntab", read(hidden))

        # Go pclntab.
        for name, data in tables.items():
            write(args.out, "go_pclntab", name, data)
        write(args.out, "go_pclntab", "embedded-go118", b"\xff" * 20 + tables["go118"])
        write(args.out, "go_pclntab", "real-go1.19-tiny", real)

        # CFI.
        for name in ["hello", "libfuzz.so.stripped", "libcfi.so", "hello-debug-frame"]:
            write(args.out, "eh_frame", name, read(elf[name]))
        go_exec = with_section(tmp, elf["hello-nopie"], ".goexe", ".gopclntab", tables["go118"])
        write(args.out, "eh_frame", "gopclntab", read(go_exec))

        # Debug links: [u32 n][binary][debug file], the link naming fuzz.debug.
        for name in ["hello", "libfuzz.so"]:
            debug = os.path.join(tmp, "fuzz.debug")
            run("objcopy", "--only-keep-debug", elf[name], debug)
            linked = os.path.join(tmp, name + ".linked")
            run("objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", elf[name], linked)
            b = read(linked)
            write(args.out, "debuglink", name, struct.pack("<I", len(b)) + b + read(debug))
        # A debuglink naming a file that is not there: found through the .build-id tree instead.
        other = os.path.join(tmp, "other.debug")
        run("objcopy", "--only-keep-debug", elf["libfuzz.so"], other)
        run("objcopy", "--strip-all", f"--add-gnu-debuglink={other}", elf["libfuzz.so"], other + ".linked")
        b = read(other + ".linked")
        write(args.out, "debuglink", "build-id-tree", struct.pack("<I", len(b)) + b + read(other))
        # No build-id: the CRC alone matches.
        noid = os.path.join(tmp, "hello-noid")
        run("gcc", *SMALL, "-Wl,--build-id=none", "-o", noid, os.path.join(tmp, "hello.c"))
        debug = os.path.join(tmp, "fuzz.debug")
        run("objcopy", "--only-keep-debug", noid, debug)
        run("objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", noid, noid + ".linked")
        b = read(noid + ".linked")
        write(args.out, "debuglink", "no-build-id", struct.pack("<I", len(b)) + b + read(debug))
        # The section alone.
        write(args.out, "debuglink", "section", b"libcrypto.so.3.debug\0\0\0\0" + struct.pack("<I", 0x1234abcd))

        # /proc text: this kernel's maps of a real process, and cgroup files.
        maps = run("cat", "/proc/self/maps")  # a small real process
        write(args.out, "proc_maps", "self-maps", maps)
        write(args.out, "proc_maps", "maps-special",
              b"7f1c2a000000-7f1c2a200000 r-xp 00002000 fd:01 1234  /usr/lib/libcrypto.so.3 (deleted)\n"
              b"7f1c2a200000-7f1c2a201000 rw-p 00000000 00:00 0    \n"
              b"7f1c2a201000-7f1c2a202000 r-xp 00000000 08:10 99 /tmp/a b/lib with spaces.so\n"
              b"ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n")
        write(args.out, "proc_maps", "cgroup-v2-docker",
              b"0::/system.slice/docker-" + b"0123456789abcdef" * 4 + b".scope\n")
        write(args.out, "proc_maps", "cgroup-kubepods",
              b"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901"
              b".slice/cri-containerd-" + b"fedcba9876543210" * 4 + b".scope\n")
        write(args.out, "proc_maps", "cgroup-v1-hybrid",
              b"12:memory:/docker/" + b"00112233445566778899aabbccddeeff" * 2 + b"\n"
              b"1:name=systemd:/user.slice\n0::/user.slice/user-0.slice/session-1.scope\n")
        write(args.out, "proc_maps", "cgroup-self", run("cat", "/proc/self/cgroup"))

        # Collector requests, encoded by protoc from text format.
        proto_dir = os.path.join(ROOT, "proto")
        now = 1_800_000_000_000_000_000  # collector/ingest/test_report.h kTestNowNs
        base = (f'report {{ agent_instance: "iiiiiiiiiiiiiiii" sequence: 7 '
                f'host {{ hostname: "host-1" cpus: 2 agent_version: "0.1.0" }} '
                f'window {{ start_unix_ns: {now - 10_000_000_000} end_unix_ns: {now} frequency_hz: 99 '
                f'period_ns: 10101010 }} busy_samples: 1000 ')
        svc = ('services { name: "nginx" busy_samples: 800 tls_samples: 300 processes: 2 '
               'tls { bucket: BUCKET_CIPHER algorithm: "AES-GCM" phase: PHASE_RECORD library: "openssl-3" '
               'samples: 200 } '
               'tls { bucket: BUCKET_SIGNATURE algorithm: "ECDSA-P256" phase: PHASE_HANDSHAKE library: "openssl-3" '
               'samples: 100 } }')
        pod = ('services { name: "api" busy_samples: 100 tls_samples: 10 container_id: "' + "ab" * 32 +
               '" pod_uid: "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901" '
               'tls { bucket: BUCKET_HASH algorithm: "SHA-256" phase: PHASE_OTHER library: "go" samples: 10 } }')
        stats = "agent { cpu_seconds: 0.5 max_rss_bytes: 50000000 dropped_samples: 3 } "
        # run --usage: handshakes, an operation with its 50 latency buckets, connections, the usage block.
        usage_svc = svc[:-2] + (
            ' handshakes { side: SIDE_SERVER kind: HANDSHAKE_KIND_FULL version: "TLSv1.3" '
            'cipher_suite: "TLS_AES_128_GCM_SHA256" group: "X25519" cert_key_type: "ECDSA" library: "openssl-3" '
            'observed: 10 estimated: 10 } '
            'handshakes { side: SIDE_CLIENT kind: HANDSHAKE_KIND_RESUMED version: "TLSv1.2" '
            'cipher_suite: "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA" group: "none" cert_key_type: "none" '
            'library: "openssl-3" observed: 2 estimated: 4 } '
            'operations { operation: OPERATION_SIGN algorithm: "ECDSA-P256" library: "openssl-3" in_handshake: true '
            'observed: 10 estimated: 20 cpu_seconds: 0.00025 ' +
            " ".join(f"latency_buckets: {8 if i == 10 else 2 if i == 12 else 0}" for i in range(50)) + ' } '
            'connections { library: "openssl-3" estimated: 7 } } '
            'usage { duty_cycle: 0.5 relative_error: 0.1 probe_cpu_seconds: 0.002 probe_hits: 100 budget_cpu_seconds: 0.1 } ')
        # The usage rows' costs: the handshakes' split CPU, the processes' memory beside their connections.
        costs_svc = usage_svc.replace("observed: 10 estimated: 10 }", "observed: 10 estimated: 10 cpu_seconds: 0.02 }")
        costs_svc = costs_svc.replace('estimated: 7 }', 'estimated: 7 resident_bytes: 73400320 }')
        for name, text in [("report", base + svc + " }"), ("report-pod-stats", base + svc + pod + stats + " }"),
                           ("report-usage", base + usage_svc + " }"),
                           ("report-usage-costs", base + costs_svc + " }"),
                           ("report-empty", base.replace("busy_samples: 1000", "busy_samples: 0") + " }")]:
            data = run("protoc", f"-I{proto_dir}", "--encode=tlsprof.v1.SubmitRequest", "tlsprof/v1/report.proto",
                       cwd=proto_dir, stdin=text.encode())
            write(args.out, "collector_ingest", name, data)

    total = 0
    for t in TARGETS:
        d = os.path.join(args.out, t)
        files = sorted(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        total += size
        print(f"{t:18} {len(files):3} files {size:9} bytes")
    print(f"{'total':18}     {total:9} bytes")


if __name__ == "__main__":
    main()
