#!/usr/bin/env python3
"""Builds the seed corpora of tests/fuzz/corpus/<target>/ (see README.md).

Every seed is made here from something real and small: tiny C programs and
libraries compiled with the system's gcc and split with binutils, the
.gopclntab of a tiny Go program built with the system's Go, Go pclntab layouts
as the Go runtime defines them (runtime/symtab.go), /proc text as this
kernel writes it, and collector requests encoded by protoc from text format.

The usage planners' seeds are slices of the real TLS libraries on this machine
(Debian's OpenSSL 3.0, Debian 11's 1.1.1 and Debian 13's 3.5 as
scripts/install-deps.sh and make-trixie-root.sh unpack them, Android's
BoringSSL, node with OpenSSL linked in) and of a tiny Go TLS program: each
library is 0.4-100 MB, a slice a few KB. A slice is an ELF file that keeps,
at their own addresses, only what the planners read (see slice_library).

Usage: tests/fuzz/make_corpus.py [--out DIR]   (default: tests/fuzz/corpus)

Seeds are named seed-*; inputs kept from fuzzing (crash-*, and what
bench/fuzz.sh --merge adds) are left alone. Rerunning rewrites the seeds; the
compilers' output may differ by a few bytes between machines, which is fine.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGETS = ["elf_symbols", "go_pclntab", "eh_frame", "debuglink", "proc_maps", "collector_ingest", "elf_functions",
           "probe_plan", "boringssl_plan", "go_plan", "accessors", "archive_match", "collector_state", "spool_batch"]


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


def go_table(magic, big_endian=False, ptr=8, quantum=1, text_start=TEXT, funcs=None, end=END):
    """A pclntab of `funcs` ([(offset from text_start, name)], sorted; FUNCS by
    default) ending at `end`, in the 1.16 (0xfffffffa), 1.18 (0xfffffff0) or
    1.20 (0xfffffff1) layout, with names, a functab, _func records and pcsp
    tables."""
    funcs = funcs or FUNCS
    t = Table(big_endian, ptr)
    t.put(0, magic, 4)
    t.put(6, quantum, 1)
    t.put(7, ptr, 1)
    new = magic in (0xfffffff0, 0xfffffff1)
    nwords = 8 if new else 7
    names = 8 + nwords * ptr
    t.put(8, len(funcs), ptr)  # nfunc
    t.put(8 + ptr, 0, ptr)  # nfiles
    if new:
        t.put(8 + 2 * ptr, text_start, ptr)
    nameoffs, off = [], names
    for _, name in funcs:
        nameoffs.append(off - names)
        off = t.put_bytes(off, name.encode() + b"\0")
    pctab = off
    pcsp = []
    for i, (entry, _) in enumerate(funcs):
        fend = funcs[i + 1][0] if i + 1 < len(funcs) else end
        size = fend - entry
        steps = [(0, 4), (8, 4), (32, size - 12), (0, 4)] if size > 12 else [(0, size)]
        pcsp.append(off - pctab)
        off = t.put_bytes(off, pcsp_table(steps, quantum))
    pcln = (off + 7) & ~7
    first = 3 if new else 2  # funcnametab, cutab, filetab, pctab, pclntab words
    for i, v in enumerate([names, pcln, pcln, pctab, pcln]):
        t.put(8 + (first + i) * ptr, v, ptr)
    fs = 4 if new else ptr
    records = pcln + (len(funcs) + 1) * 2 * fs
    func_size = fs + 4 * 8 + 4
    base = 0 if new else text_start
    for i, (entry, _) in enumerate(funcs):
        funcoff = records + i * func_size - pcln
        t.put(pcln + i * 2 * fs, base + entry, fs)
        t.put(pcln + i * 2 * fs + fs, funcoff, fs)
        f = pcln + funcoff
        t.put(f, base + entry, fs)
        t.put(f + fs, nameoffs[i], 4)  # nameOff
        t.put(f + fs + 4, 0, 4)  # args
        t.put(f + fs + 8, 0, 4)  # deferreturn
        t.put(f + fs + 12, pcsp[i], 4)  # pcsp
        t.put_bytes(f + fs + 16, bytes(16))  # pcfile, pcln, npcdata, cuOffset + flags
    t.put(pcln + len(funcs) * 2 * fs, base + end, fs)
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


# --- ELF slices of real TLS libraries (the usage planners' seeds) ----------

PT_LOAD, PF_X = 1, 1
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_DYNSYM = 1, 2, 3, 4, 11
SHF_ALLOC, SHF_EXECINSTR, SHF_INFO_LINK, SHF_COMPRESSED = 2, 4, 0x40, 0x800
STT_FUNC, SHN_ABS = 2, 0xfff1
R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE = 7, 8
ET_EXEC = 2
# What the planners look for (agent/usage/probe_plan.cc, boringssl_plan.cc):
# probed functions, of which only the first bytes are read...
PROBED = ["SSL_do_handshake", "EVP_DigestSign", "EVP_PKEY_sign", "EVP_DigestVerify", "EVP_PKEY_verify",
          "EVP_PKEY_derive", "EVP_PKEY_encapsulate", "EVP_PKEY_decapsulate", "SSL_free", "X25519", "KYBER_encap",
          "KYBER_decap"]
# ... and the method getters and accessors, whose code is decoded and followed.
DECODED = ["TLS_method", "TLS_server_method", "TLS_client_method", "SSL_version", "SSL_get_state",
           "SSL_session_reused", "SSL_is_server", "SSL_get_current_cipher", "SSL_CIPHER_get_protocol_id",
           "SSL_get_privatekey", "EVP_PKEY_get_id", "EVP_MD_CTX_get_pkey_ctx", "EVP_PKEY_CTX_get0_pkey", "EVP_PKEY_id",
           "EVP_MD_CTX_pkey_ctx", "SSL_in_init", "SSL_get_curve_id", "SSL_in_early_data", "SSL_get_session"]
METHODS = ["TLS_method", "TLS_server_method", "TLS_client_method"]  # they return SSL_METHOD tables
WINDOW = 192  # agent/usage/elf_functions.h kPrefixBytes
TABLE = 0x80  # probe_plan.cc kMethodTableBytes


class Elf:
    """The parts of an ELF64 little-endian file the slices need."""

    def __init__(self, data):
        self.b = data
        (self.type, self.machine, _, self.entry, phoff, shoff, _, _, _, phnum, _, shnum,
         shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
        self.phdrs = []
        for i in range(phnum):
            p_type, flags, offset, vaddr, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + 56 * i)
            self.phdrs.append(dict(type=p_type, flags=flags, offset=offset, vaddr=vaddr, filesz=filesz))
        self.sections = []
        for i in range(shnum):
            name, sh_type, flags, addr, offset, size, link, info, _, entsize = struct.unpack_from(
                "<IIQQQQIIQQ", data, shoff + 64 * i)
            self.sections.append(dict(name=name, type=sh_type, flags=flags, addr=addr, offset=offset, size=size,
                                      link=link, info=info, entsize=entsize))
        strtab = self.sections[shstrndx]
        for s in self.sections:
            s["name"] = self.cstr(strtab["offset"] + s["name"])

    def cstr(self, off):
        return self.b[off:self.b.index(b"\0", off)].decode(errors="replace")

    def section(self, name):
        return next((s for s in self.sections if s["name"] == name), None)

    def symbols(self, sec):
        strtab = self.sections[sec["link"]]
        for off in range(sec["offset"], sec["offset"] + sec["size"], 24):
            name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.b, off)
            yield dict(name=self.cstr(strtab["offset"] + name), info=info, other=other, shndx=shndx, value=value,
                       size=size)

    def functions(self):
        """name (without @version) -> the first defined function of .symtab/.dynsym, as FindFunctions picks."""
        out = {}
        for sec in self.sections:
            if sec["type"] not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            for sym in self.symbols(sec):
                if sym["info"] & 0xf == STT_FUNC and sym["shndx"] != 0 and sym["value"] != 0:
                    out.setdefault(sym["name"].split("@")[0], sym)
        return out

    def relas(self):
        """(r_offset, type, symbol name or None, addend) of every SHT_RELA section."""
        for sec in self.sections:
            if sec["type"] != SHT_RELA:
                continue
            syms = list(self.symbols(self.sections[sec["link"]])) if sec["link"] else []
            for off in range(sec["offset"], sec["offset"] + sec["size"], 24):
                r_offset, info, addend = struct.unpack_from("<QQq", self.b, off)
                sym = info >> 32
                yield r_offset, info & 0xffffffff, syms[sym]["name"] if 0 < sym < len(syms) else None, addend

    def segment(self, vaddr, executable):
        for p in self.phdrs:
            if p["type"] == PT_LOAD and p["vaddr"] <= vaddr < p["vaddr"] + p["filesz"]:
                if not executable or p["flags"] & PF_X:
                    return p
        return None

    def read(self, vaddr, n, executable=True):
        p = self.segment(vaddr, executable)
        if p is None:
            return b""
        n = min(n, p["vaddr"] + p["filesz"] - vaddr)
        off = vaddr - p["vaddr"] + p["offset"]
        return self.b[off:off + n]


def references(code, vaddr, tmp):
    """objdump's reading of x86-64 `code` at `vaddr`: (kind, address, at) for
    each direct call ('call'), jump ('jmp': unconditional, 'jcc'),
    RIP-relative operand ('rip'), `jmp *x(%rip)` ('got') and `mov
    $imm32,%eax` ('imm') of the instruction at `at`."""
    path = os.path.join(tmp, "window.bin")
    with open(path, "wb") as f:
        f.write(code)
    out = run("objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "-w", f"--adjust-vma={vaddr:#x}", path).decode()
    refs = []
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\t(?:[0-9a-f]{2} )+\s*\t(?:bnd )?(\S+)\s*(.*)$", line)
        if not m:
            continue
        at, mnemonic, ops = int(m.group(1), 16), m.group(2), m.group(3)
        if mnemonic.startswith("j") or mnemonic == "call":
            if t := re.match(r"(0x[0-9a-f]+)\b", ops):
                refs.append((mnemonic if mnemonic in ("call", "jmp") else "jcc", int(t.group(1), 16), at))
        if c := re.search(r"# (0x[0-9a-f]+)", ops):
            refs.append(("got" if mnemonic == "jmp" and ops.startswith("*") else "rip", int(c.group(1), 16), at))
        if mnemonic == "mov" and (i := re.match(r"\$(0x[0-9a-f]+),%eax$", ops)):
            refs.append(("imm", int(i.group(1), 16), at))
    return refs


def merge_windows(windows):
    """[(vaddr, bytes)] -> the same bytes as sorted, disjoint, maximal runs."""
    out = []
    for v, b in sorted(windows):
        if out and v <= out[-1][0] + len(out[-1][1]):
            pv, pb = out[-1]
            end = max(pv + len(pb), v + len(b))
            merged = bytearray(end - pv)
            merged[:len(pb)] = pb
            merged[v - pv:v - pv + len(b)] = b
            out[-1] = (pv, bytes(merged))
        else:
            out.append((v, b))
    return out


def write_elf(e_type, entry, code, data, symbols, relas, symtab=".dynsym", extra=()):
    """A little-endian x86-64 ELF file: a PT_LOAD and a section per run of
    `code` (r-x, .text) and `data` (r--, .data.rel.ro) at their own
    addresses; `symbols` [(name, value, size, info)] in .dynsym or .symtab
    (st_shndx: the section holding the value, else SHN_ABS, or 0 for an
    undefined one of value 0); `relas` [(offset, type, symbol name, addend)]
    as .rela.dyn and (JUMP_SLOTs) .rela.plt; `extra` [(name, flags, addr,
    bytes)] further sections."""
    loads = [(v, b, 5, ".text", SHF_ALLOC | SHF_EXECINSTR) for v, b in merge_windows(code)]
    loads += [(v, b, 4, ".data.rel.ro", SHF_ALLOC) for v, b in merge_windows(data)]
    body = bytearray()
    first = 64 + 56 * len(loads)
    shdrs = [(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    names = bytearray(b"\0")

    def name(n):
        at = len(names)
        names.extend(n.encode() + b"\0")
        return at

    def place(blob, align=8):
        while (first + len(body)) % align:
            body.append(0)
        at = first + len(body)
        body.extend(blob)
        return at

    phdrs = []
    for v, b, flags, sec_name, sec_flags in loads:
        at = place(b, 16)
        phdrs.append(struct.pack("<IIQQQQQQ", PT_LOAD, flags, at, v, v, len(b), len(b), 1))
        shdrs.append((name(sec_name), SHT_PROGBITS, sec_flags, v, at, len(b), 0, 0, 16, 0))

    def shndx(value):
        for i, (v, b, *_rest) in enumerate(loads):
            if v <= value < v + len(b):
                return i + 1
        return SHN_ABS if value else 0

    sym_index = {}
    syms, strs = bytearray(24), bytearray(b"\0")
    for sname, value, size, info in symbols:
        sym_index.setdefault(sname, len(syms) // 24)
        syms += struct.pack("<IBBHQQ", len(strs), info, 0, shndx(value), value, size)
        strs += sname.encode() + b"\0"
    symtab_at = len(shdrs) if symbols or relas else 0  # none: no symbol table (a Go binary linked with -s)
    if symtab_at:
        sym_off = place(syms)
        str_off = place(strs, 1)
        shdrs.append((name(symtab), SHT_DYNSYM if symtab == ".dynsym" else SHT_SYMTAB, SHF_ALLOC, 0, sym_off,
                      len(syms), symtab_at + 1, 1, 8, 24))
        shdrs.append((name(".dynstr" if symtab == ".dynsym" else ".strtab"), SHT_STRTAB, 0, 0, str_off, len(strs), 0,
                      0, 1, 0))
    for sec_name, plt in ((".rela.dyn", False), (".rela.plt", True)):
        rows = sorted(r for r in relas if (r[1] == R_X86_64_JUMP_SLOT) == plt)
        if not rows:
            continue
        blob = b"".join(struct.pack("<QQq", off, (sym_index.get(sym, 0) << 32) | rtype, addend)
                        for off, rtype, sym, addend in rows)
        shdrs.append((name(sec_name), SHT_RELA, SHF_ALLOC | (SHF_INFO_LINK if plt else 0), 0, place(blob), len(blob),
                      symtab_at, 0, 8, 24))
    for sec_name, flags, addr, blob in extra:
        align = 8 if flags & SHF_COMPRESSED else 1  # an Elf64_Chdr leads a compressed section
        shdrs.append((name(sec_name), SHT_PROGBITS, flags, addr, place(blob, align), len(blob), 0, 0, align, 0))
    shstrndx = len(shdrs)
    shdrs.append((name(".shstrtab"), SHT_STRTAB, 0, 0, 0, len(names), 0, 0, 1, 0))
    names_off = place(names, 1)
    shdrs[-1] = shdrs[-1][:4] + (names_off,) + shdrs[-1][5:]
    shoff = place(b"".join(struct.pack("<IIQQQQIIQQ", *h) for h in shdrs))
    ehdr = (b"\x7fELF\x02\x01\x01" + bytes(9) +
            struct.pack("<HHIQQQIHHHHHH", e_type, 62, 1, entry, 64, shoff, 0, 64, 56, len(loads), 64, len(shdrs),
                        shstrndx))
    return ehdr + b"".join(phdrs) + bytes(body)


def slice_library(path, tmp):
    """A slice of the TLS library at `path` for the usage planners: the first
    WINDOW bytes of every function they look for, at its own address; for the
    getters and accessors (DECODED) also the code their direct calls and
    jumps reach, and the method tables a getter returns (their
    R_X86_64_RELATIVE relocations, or their words in a fixed-address
    executable) with the code those point at and its tail calls (the
    handshake state machine); the PLT slots a kept stub jumps through
    (R_X86_64_JUMP_SLOT); and the symbols naming all of it. Everything else
    (the rest of the code, data, headers) is left out."""
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: scripts/install-deps.sh (and scripts/make-trixie-root.sh) install it")
    elf = Elf(read(path))
    fns = elf.functions()
    wanted = {n: fns[n] for n in PROBED + DECODED if n in fns}
    fixed = elf.type == ET_EXEC
    relocs = list(elf.relas())
    relative = {r[0]: r for r in relocs if r[1] == R_X86_64_RELATIVE}
    code, data, kept_relas, got = [], [], set(), set()
    # (address, what to follow from its window: "all", "tail" (jmp only) or "none")
    queue = [(sym["value"], "all" if n in DECODED else "none") for n, sym in wanted.items()]
    getters = {wanted[n]["value"] for n in METHODS if n in wanted}
    seen = set()
    while queue:
        vaddr, follow = queue.pop(0)
        if vaddr in seen:
            continue
        seen.add(vaddr)
        window = elf.read(vaddr, WINDOW)
        if not window:
            continue
        code.append((vaddr, window))
        for kind, target, at in references(window, vaddr, tmp):
            if kind == "got" and at < vaddr + 16:  # a PLT stub (16 bytes) at the window's start
                got.add(target)
            elif follow == "all" and kind in ("call", "jmp", "jcc"):
                queue.append((target, "none"))
            elif follow == "tail" and kind == "jmp":
                queue.append((target, "none"))
            elif (vaddr in getters and at < vaddr + 8 and (kind == "rip" or (kind == "imm" and fixed)) and
                  not elf.segment(target, True)):
                # The table the getter returns (its first instruction, after
                # an endbr64): its pointers, and the code they point at.
                pointers = []
                if fixed:
                    words = elf.read(target, TABLE, executable=False)
                    if words:
                        data.append((target, words))
                        pointers = [struct.unpack_from("<Q", words, i)[0] for i in range(0, len(words) - 7, 8)]
                else:
                    for off in range(target, target + TABLE, 8):
                        if off in relative:
                            kept_relas.add(relative[off])
                            pointers.append(relative[off][3])
                queue += [(p, "tail") for p in pointers if elf.segment(p, True)]
    for r in relocs:
        if r[1] == R_X86_64_JUMP_SLOT and r[0] in got:
            kept_relas.add(r)
    symbols = [(n, s["value"], s["size"], s["info"]) for n, s in wanted.items()]
    for sym in sorted({r[2] for r in kept_relas if r[2]}):
        if sym not in wanted:
            s = fns.get(sym)
            # A slot's symbol: defined (its code left out) or imported.
            symbols.append((sym, s["value"] if s else 0, s["size"] if s else 0, s["info"] if s else 0x12))
    return write_elf(elf.type, 0, code, data, symbols, kept_relas, ".symtab" if fixed else ".dynsym")


def accessor_windows(path):
    """The first WINDOW bytes of each accessor (DECODED) the library defines."""
    elf = Elf(read(path))
    fns = elf.functions()
    return {n: elf.read(fns[n]["value"], WINDOW) for n in DECODED if n in fns}


# --- Go: a tiny crypto/tls program -------------------------------------------

GO_TLS = """package main

import (
	"crypto/tls"
	"net"
)

func main() {
	a, b := net.Pipe()
	go tls.Server(a, &tls.Config{}).Handshake()
	c := tls.Client(b, &tls.Config{InsecureSkipVerify: true})
	c.Handshake()
	c.Close()
}
"""

# What go_plan.cc probes (kGoProbed), as this program links them.
GO_PROBED = re.compile(r"crypto/(tls\.\(\*Conn\)\.(serverHandshake|clientHandshake|Close)|"
                       r"(ecdsa|rsa)\.\(\*PrivateKey\)\.Sign|ed25519\.PrivateKey\.Sign|ecdsa\.VerifyASN1|"
                       r"rsa\.Verify(PKCS1v15|PSS)|ed25519\.Verify|tls\.\(\*(x25519|nist)Parameters\)\.SharedKey)$")

# tls.Conn's three fields at Go 1.19's offsets (go_plan.cc's table: vers 64,
# cipherSuite 90, didResume 88), as DWARF from gcc; the struct's name is
# patched to Go's afterwards (both 15 bytes).
CONN_C = r"""
struct crypto_tls_Conn {
  unsigned char before[64];
  unsigned short vers;
  unsigned char between[22];
  _Bool didResume;
  unsigned char pad;
  unsigned short cipherSuite;
};
struct crypto_tls_Conn conn;
"""


def go_conn_dwarf(tmp):
    """[(section name, flags, bytes)]: .debug_info, .debug_abbrev and
    .debug_str describing crypto/tls.Conn, zlib-compressed (SHF_COMPRESSED)
    where that makes them smaller, as Go 1.19 writes its DWARF."""
    src, so = os.path.join(tmp, "conn.c"), os.path.join(tmp, "conn.so")
    with open(src, "w") as f:
        f.write(CONN_C)
    run("gcc", "-g", "-gdwarf-4", "-shared", "-nostdlib", "-o", so, src)
    b = read(so).replace(b"crypto_tls_Conn", b"crypto/tls.Conn")
    with open(so, "wb") as f:
        f.write(b)
    run("objcopy", "--compress-debug-sections=zlib-gabi", so)
    elf = Elf(read(so))
    out = []
    for name in [".debug_info", ".debug_abbrev", ".debug_str"]:
        sec = elf.section(name)
        out.append((name, sec["flags"], elf.b[sec["offset"]:sec["offset"] + sec["size"]]))
    return out


def go_slices(tmp):
    """Slices of a tiny Go TLS program for the Go plan: the probed functions'
    whole code at their addresses and the real .go.buildinfo, named by a
    .symtab (with tls.Conn in compressed DWARF), or, as in a binary linked
    with -s -w, by a .gopclntab in Go 1.18's layout that lists them at their
    addresses. Also returns the first bytes of two functions (Go prologues)."""
    d = os.path.join(tmp, "gotls")
    os.makedirs(d)
    with open(os.path.join(d, "main.go"), "w") as f:
        f.write(GO_TLS)
    with open(os.path.join(d, "go.mod"), "w") as f:
        f.write("module tiny\n\ngo 1.19\n")
    r = subprocess.run(["go", "build", "-trimpath", "-o", "tls", "."], cwd=d, capture_output=True,
                       env=dict(os.environ, GOCACHE=os.path.join(tmp, "gocache"), GOFLAGS="-mod=mod",
                                CGO_ENABLED="0"))
    if r.returncode != 0:
        sys.exit("go build failed:\n" + r.stderr.decode(errors="replace"))
    elf = Elf(read(os.path.join(d, "tls")))
    probed = sorted((s["value"], s["size"], s["name"]) for s in elf.symbols(elf.section(".symtab"))
                    if s["info"] & 0xf == STT_FUNC and GO_PROBED.match(s["name"]))
    code = [(v, elf.read(v, size)) for v, size, _ in probed]
    bi = elf.section(".go.buildinfo")
    buildinfo = (".go.buildinfo", SHF_ALLOC, bi["addr"], elf.b[bi["offset"]:bi["offset"] + bi["size"]])
    symtab = write_elf(ET_EXEC, elf.entry, code, [], [(n, v, size, 0x12) for v, size, n in probed], [], ".symtab",
                       [buildinfo] + [(n, flags, 0, b) for n, flags, b in go_conn_dwarf(tmp)])
    # The pclntab: each probed function, and a filler from its end to the next.
    text = elf.section(".text")["addr"]
    funcs = []
    for v, size, n in probed:
        if funcs and funcs[-1][0] == v - text:
            funcs.pop()
        funcs += [(v - text, n), (v + size - text, "go.filler")]
    end = funcs.pop()[0]
    pclntab = go_table(0xfffffff0, text_start=text, funcs=funcs, end=end)
    stripped = write_elf(ET_EXEC, elf.entry, code, [], [], [], ".symtab",
                         [buildinfo, (".gopclntab", SHF_ALLOC, 0, pclntab)])
    prologues = {n: elf.read(v, 64) for v, _, n in probed[:2]}
    return symtab, stripped, prologues


# --- static archives -----------------------------------------------------------


def archive_pair(tmp, objects, cflags):
    """u32 length, an ar archive of `objects` (C or assembly sources compiled
    with `cflags`), then a stripped shared library linked from the same
    objects: what archive_match_fuzz reads."""
    objs = []
    for src in objects:
        obj = os.path.join(tmp, os.path.basename(src) + "".join(cflags) + ".o")
        run("gcc", "-c", "-fPIC", *cflags, "-o", obj, src)
        objs.append(obj)
    ar = os.path.join(tmp, "libarch" + "".join(cflags) + ".a")
    if os.path.exists(ar):
        os.remove(ar)
    run("ar", "rcs", ar, *objs)
    so = ar[:-2] + ".so"
    run("gcc", "-shared", "-Wl,--build-id", "-Wl,-soname,libarch.so.1", "-o", so, *objs, "-lpthread")
    run("strip", "--strip-all", so)
    a = read(ar)
    return struct.pack("<I", len(a)) + a + read(so)


# --- state on disk: the collector's state directory, the agent's spool ----------


def pb_varint(v):
    return uvarint(v & ((1 << 64) - 1))


def pb_bytes(field, data):
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def frame(payload):
    """collector/store/journal.h's frame: u32 length, u32 CRC-32, payload."""
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def journal_record(key, received_ns, submit_request=None, report=None):
    """A state::JournalRecord: agent_key (1), received_unix_ns (2), and the
    SubmitRequest as received (4) or, as older records, the report (3)."""
    out = pb_bytes(1, key) + pb_varint(2 << 3) + pb_varint(received_ns)
    if submit_request is not None:
        out += pb_bytes(4, submit_request)
    if report is not None:
        out += pb_bytes(3, report)
    return out


def state_dir_input(snapshot, segments, reframe=True):
    """collector_state_fuzz's input: u8 flags (bit 0: the harness recomputes
    the frames' CRCs), u32 length and the snapshot file (None: none), then
    each journal segment as u8 generation, u32 length, bytes."""
    out = bytes([1 if reframe else 0])
    out += struct.pack("<I", 0xffffffff) if snapshot is None else struct.pack("<I", len(snapshot)) + snapshot
    for generation, data in segments:
        out += struct.pack("<BI", generation, len(data)) + data
    return out


def state_snapshot_text(now, generation):
    """A state::State as a collector with two agents (one with usage) writes it."""
    words = " ".join(f"seen: {0xff if i == 0 else 0}" for i in range(16))  # SequenceWindow::kWidth / 64
    buckets = " ".join(f"latency_buckets: {3 if i == 10 else 0}" for i in range(50))  # v1::kLatencyBuckets
    service = '"nginx" labels: "" labels: ""'
    return (
        f'journal_generation: {generation} reports: 3 skewed_reports: 1 series_refused: 2 '
        'cpu { bucket: "cipher" algorithm: "AES-GCM" phase: "record" library: "openssl-3" service: "nginx" '
        'seconds: 2.5 } '
        'cpu { bucket: "signature" algorithm: "ECDSA-P256" phase: "handshake" library: "openssl-3" service: "api" '
        'seconds: 0.5 container_id: "' + "ab" * 32 + '" pod_uid: "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901" } '
        'busy { name: "nginx" seconds: 8 } busy { name: "(non-tls)" seconds: 1 } '
        'host_cpu { host: "host-1" bucket: "cipher" seconds: 2.5 } host_busy { name: "host-1" seconds: 9 } '
        f'agents {{ key: "insecure:host-1" instances {{ instance: "iiiiiiiiiiiiiiii" highest: 7 {words} '
        f'last_seen_unix_ns: {now} }} series: 1 series: 2 services: 3 last_seen_unix_ns: {now} reports: 3 '
        f'hostname: "host-1" clock_skew_ns: -2000000 '
        f'connections {{ labels: {service} labels: "openssl-3" value: 7 resident_bytes: 73400320 }} '
        f'usage_instance: "iiiiiiiiiiiiiiii" usage_sequence: 7 duty_cycle: 0.5 relative_error: 0.1 '
        f'usage_received_unix_ns: {now} usage_window_ns: 10000000000 }} '
        f'agents {{ key: "relay-1\\000host-2" last_seen_unix_ns: {now - 60_000_000_000} reports: 1 }} '
        f'minutes {{ minute: {now // 60_000_000_000} reports: 3 agents: 11 busy_seconds: 9 tls_seconds: 3 '
        'bucket_seconds: 0 bucket_seconds: 2.5 bucket_seconds: 0.5 '
        'algorithms { bucket: 1 algorithm: "AES-GCM" seconds: 2.5 } } '
        f'handshakes {{ labels: {service} labels: "openssl-3" labels: "server" labels: "full" labels: "TLSv1.3" '
        'labels: "TLS_AES_128_GCM_SHA256" labels: "X25519" labels: "ECDSA" value: 10 } '
        f'operations {{ labels: {service} labels: "openssl-3" labels: "sign" labels: "ECDSA-P256" labels: "true" '
        f'value: 20 cpu_seconds: 0.005 observed: 10 observed_cpu_seconds: 0.0025 {buckets} }} '
        f'handshake_cpu {{ labels: {service} labels: "openssl-3" labels: "full" labels: "ECDSA" value: 0.02 }} '
        'probe_cpu_seconds: 0.002 probe_hits: 100 probe_budget_cpu_seconds: 0.1')


def spool_batch(report):
    """agent/ship/spool.cc's batch file: magic, u64 length, u32 CRC-32, the AgentReport."""
    return b"TLSPSPL1" + struct.pack("<QI", len(report), zlib.crc32(report)) + report


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

        def encode(message, text, seq=7, proto="tlsprof/v1/report.proto", where=proto_dir, include=()):
            text = text.replace("sequence: 7 ", f"sequence: {seq} ")
            return run("protoc", f"-I{where}", *(f"-I{i}" for i in include), f"--encode={message}", proto, cwd=where,
                       stdin=text.encode())

        def request(text, seq):
            return encode("tlsprof.v1.SubmitRequest", text, seq)

        def report(text, seq):
            # The AgentReport alone: the request's text without its `report { ... }`.
            inner = text[len("report {"):text.rindex("}")]
            return encode("tlsprof.v1.AgentReport", inner, seq)

        plain, with_usage, with_pod = base + svc + " }", base + usage_svc + " }", base + svc + pod + stats + " }"

        # The collector's state directory: journal segments of framed
        # JournalRecords (the SubmitRequest as received, or the report in
        # older records) and a framed snapshot.
        key = b"insecure:host-1"
        records = [frame(journal_record(key, now + i, submit_request=request(t, 7 + i)))
                   for i, t in enumerate([plain, with_usage, with_pod])]
        snapshot = frame(encode("tlsprof.collector.state.State", state_snapshot_text(now, 1), proto="state.proto",
                                where=os.path.join(ROOT, "collector", "store"), include=[proto_dir]))
        write(args.out, "collector_state", "journal", state_dir_input(None, [(0, b"".join(records))]))
        write(args.out, "collector_state", "journal-torn-tail",
              state_dir_input(None, [(0, records[0] + records[1][:len(records[1]) // 2])]))
        write(args.out, "collector_state", "journal-old-record",
              state_dir_input(None, [(0, frame(journal_record(key, now, report=report(plain, 7))))]))
        write(args.out, "collector_state", "snapshot-and-journal",
              state_dir_input(snapshot, [(0, records[0]), (1, records[1] + records[2])]))
        write(args.out, "collector_state", "snapshot-and-journal-as-written",
              state_dir_input(snapshot, [(1, records[1])], reframe=False))

        # The agent's spool: batch files, and a batch with its pin file.
        def pair(a, b):
            return struct.pack("<I", len(a)) + a + b

        # spool_batch_fuzz's input: u8 flags (bit 0: the harness seals the header), then the files.
        seal, raw = b"\x01", b"\x00"
        write(args.out, "spool_batch", "batch-7", seal + spool_batch(report(plain, 7)))
        write(args.out, "spool_batch", "batch-7-usage", seal + spool_batch(report(with_usage, 7)))
        write(args.out, "spool_batch", "batch-7-pin",
              seal + pair(spool_batch(report(plain, 7)), b"collector-a:4317\n"))
        write(args.out, "spool_batch", "batch-9-pin-unsealed",
              raw + pair(spool_batch(report(with_pod, 9)), b"collector-b:4317\n"))

        # The usage planners: slices of the real TLS libraries, libssl then
        # libcrypto (u32 length of the first, as the targets split them).
        lib = "/usr/lib/x86_64-linux-gnu"
        libraries = {
            "openssl3": (f"{lib}/libssl.so.3", f"{lib}/libcrypto.so.3"),
            "openssl11": (f"/opt/tlsprof-openssl-1.1{lib}/libssl.so.1.1", f"/opt/tlsprof-openssl-1.1{lib}/libcrypto.so.1.1"),
            "openssl35": (f"/opt/tlsprof-trixie{lib}/libssl.so.3", f"/opt/tlsprof-trixie{lib}/libcrypto.so.3"),
            "boringssl": (f"{lib}/android/libssl.so.0", f"{lib}/android/libcrypto.so.0"),
        }
        accessors = {}
        for name, (ssl, crypto) in libraries.items():
            ssl_slice, crypto_slice = slice_library(ssl, tmp), slice_library(crypto, tmp)
            write(args.out, "elf_functions", f"{name}-libssl", ssl_slice)
            write(args.out, "elf_functions", f"{name}-libcrypto", crypto_slice)
            # One file set of the other family is a seed too: its plan finds nothing to decode.
            if name != "boringssl":
                write(args.out, "probe_plan", name, pair(ssl_slice, crypto_slice))
            if name in ("boringssl", "openssl3"):
                write(args.out, "boringssl_plan", name, pair(ssl_slice, crypto_slice))
            if name == "boringssl":
                write(args.out, "probe_plan", name, pair(ssl_slice, crypto_slice))
            for path in (ssl, crypto):
                for fn, code in accessor_windows(path).items():
                    accessors.setdefault(code, f"{name}-{fn}")
        # node links OpenSSL in, at fixed addresses (ET_EXEC: the method tables are words, not relocations).
        node = shutil.which("node")
        if node is None:
            sys.exit("node is missing: scripts/install-deps.sh installs it")
        node_slice = slice_library(os.path.realpath(node), tmp)
        write(args.out, "elf_functions", "node", node_slice)
        write(args.out, "probe_plan", "node", node_slice)
        write(args.out, "elf_functions", "libfuzz.so", read(elf["libfuzz.so"]))
        for code, name in accessors.items():
            write(args.out, "accessors", name, code)

        # The Go plan: a tiny crypto/tls program, named by .symtab (DWARF) or by .gopclntab (-s -w).
        go_symtab, go_stripped, prologues = go_slices(tmp)
        write(args.out, "go_plan", "tls-symtab-dwarf", go_symtab)
        write(args.out, "go_plan", "tls-stripped-gopclntab", go_stripped)
        write(args.out, "go_plan", "not-go", read(elf["hello.stripped"]))
        for name, code in prologues.items():
            write(args.out, "accessors", "go-" + re.sub(r"[^A-Za-z0-9.]+", "_", name), code)

        # Static archives: the objects of a library in an ar archive, and the
        # library linked from them; then an archive from another build.
        objects = [os.path.join(tmp, "lib.c"), PROVIDER_C, os.path.join(tmp, "cfi.S")]
        same = archive_pair(tmp, objects, ["-O2"])
        write(args.out, "archive_match", "same-build", same)
        other = archive_pair(tmp, objects, ["-O1"])
        n = struct.unpack_from("<I", same)[0]
        write(args.out, "archive_match", "other-build", same[:4 + n] + other[4 + struct.unpack_from("<I", other)[0]:])

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
