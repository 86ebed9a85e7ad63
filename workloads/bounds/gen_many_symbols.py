#!/usr/bin/env python3
"""Writes the assembly of tlsprof-many-symbols: COUNT small, distinct functions
(bounds_fn_000000 ...) with CFI, and a table of their addresses (bounds_fns,
bounds_fn_count). Assembly rather than C so that 100k functions build in a
second or two instead of a minute of compiling.

    gen_many_symbols.py OUT.S [COUNT]
"""
import sys


def main():
    out = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
    parts = ["\t.text\n"]
    for i in range(count):
        name = f"bounds_fn_{i:06d}"
        # A frame-pointer prologue: four CFI rows per function, like -O0 code.
        parts.append(
            f"\t.globl {name}\n\t.type {name},@function\n{name}:\n\t.cfi_startproc\n"
            "\tpush %rbp\n\t.cfi_def_cfa_offset 16\n\t.cfi_offset %rbp,-16\n"
            "\tmov %rsp,%rbp\n\t.cfi_def_cfa_register %rbp\n"
            f"\tlea {i % 1000 + 1}(%rdi,%rdi,2),%rax\n\txor $0x{i & 0xffff:x},%rax\n"
            "\tpop %rbp\n\t.cfi_def_cfa %rsp,8\n\tret\n\t.cfi_endproc\n"
            f"\t.size {name},.-{name}\n")
    parts.append("\t.section .data.rel.ro,\"aw\"\n\t.balign 8\n\t.globl bounds_fns\n\t.type bounds_fns,@object\n"
                 "bounds_fns:\n")
    for i in range(count):
        parts.append(f"\t.quad bounds_fn_{i:06d}\n")
    parts.append(f"\t.size bounds_fns,{8 * count}\n")
    parts.append("\t.section .rodata\n\t.balign 8\n\t.globl bounds_fn_count\n\t.type bounds_fn_count,@object\n"
                 f"bounds_fn_count:\n\t.quad {count}\n\t.size bounds_fn_count,8\n")
    parts.append("\t.section .note.GNU-stack,\"\",@progbits\n")
    with open(out, "w") as f:
        f.write("".join(parts))


if __name__ == "__main__":
    main()
