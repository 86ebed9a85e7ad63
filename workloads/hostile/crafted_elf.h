// Crafted ELF files for the hostile-tenant test (tests/integration/test_hostile.py).
//
// Each file is well-formed enough that the agent's readers accept it (ELF64,
// x86-64, sections and program headers in range of the file) and shaped so
// that one reader, without a bound, does work or allocates memory in
// proportion to a number the file's owner chose. They are what a tenant of the
// host can put in its own container and map executable; none of them is ever
// run. Generation is fast (seconds at most): large regions are left as holes
// of a sparse file, and big tables are written in chunks.
//
// Every function replaces `out` and throws std::runtime_error with the reason
// on failure. Not thread-safe (they write files).
#pragma once

#include <cstdint>
#include <string>

namespace tlsprof::hostile {

// A sparse file of `size_bytes` (64 GiB in the test) whose small executable
// .text is real, and whose section and note headers claim sections of
// gigabytes (.dynsym, .symtab, their string tables, .eh_frame, .debug_frame,
// the build-id note, .gnu_debuglink) in the holes far into the file.
void WriteSparseElf(const std::string& out, uint64_t size_bytes);

// `count` global function symbols SSL_0000000, SSL_0000001, ... in a real
// .symtab (24 bytes each) and .strtab, one byte of .text apart.
void WriteManySymbolsElf(const std::string& out, uint64_t count);

// One FDE whose CFA program alternates DW_CFA_advance_loc 1 and
// DW_CFA_def_cfa_offset over `rows` bytes of code: `rows` rows in one FDE.
void WriteLongFdeElf(const std::string& out, uint64_t rows);

// A Go 1.20 pclntab (with .go.buildinfo beside it, so it reads as Go) over
// `text_bytes` of .text split into `functions` equal functions named
// crypto/tls.hostileNNNNNN, all pointing at one shared pcsp table whose SP
// delta changes at every byte: text_bytes rows in all.
void WriteSharedPcspGoElf(const std::string& out, uint64_t text_bytes, uint64_t functions);

// A copy of `in` with its GNU build-id (NT_GNU_BUILD_ID) replaced by
// `build_id_hex` (as many bytes as the original's).
void CopyWithBuildId(const std::string& in, const std::string& out, const std::string& build_id_hex);

// A copy of `in` with a .symtab added that names all of its code wrongly:
// every exported function of .dynsym, and every gap between them inside the
// executable sections, becomes a global function `prefix`N of the same range.
// With `build_id_hex`, the copy's build-id is replaced too (CopyWithBuildId).
void CopyWithCraftedSymtab(const std::string& in, const std::string& out, const std::string& prefix,
                           const std::string& build_id_hex);

}  // namespace tlsprof::hostile
