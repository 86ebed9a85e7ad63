// Go's pclntab: function entry PCs and names of a Go binary, read without
// .symtab (Go binaries built with -ldflags=-s keep .gopclntab because the
// runtime itself needs it for tracebacks).
//
// Layout (runtime/symtab.go, debug/gosym/pclntab.go):
//   pcHeader: magic u32, pad u8 x2, minLC u8, ptrSize u8, then uintptr words:
//     1.18+ (0xfffffff0, 1.20+ 0xfffffff1): nfunc, nfiles, textStart,
//        funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset
//     1.16/1.17 (0xfffffffa): nfunc, nfiles, funcnameOffset, cuOffset,
//        filetabOffset, pctabOffset, pclnOffset
//     1.2-1.15 (0xfffffffb): nfunc; the functab follows the header directly.
//   functab at pclnOffset: nfunc + 1 pairs {entry, funcoff}; u32 offsets from
//     textStart in 1.18+, uintptr PCs before. The last pair's entry is the end
//     of the module's text.
//   _func at pclntab + funcoff: entry (u32 offset in 1.18+, uintptr before),
//     then nameOff i32 into funcnametab (into the whole table before 1.16).
//
// Only the first text section is handled (Go splits text only for very large
// binaries on ppc64/arm, which tlsprof does not target).
//
// Every read is bounds-checked against the span: a corrupt table gives an
// Error, and nothing is allocated in proportion to a count read from the file.
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "common/result.h"

namespace tlsprof::symbols {

enum class GoPclntabVersion { kGo12, kGo116, kGo118, kGo120 };

struct GoPclntabHeader {
  GoPclntabVersion version = GoPclntabVersion::kGo118;
  bool big_endian = false;
  uint8_t quantum = 1;   // minLC
  uint8_t ptr_size = 8;  // 4 or 8
  uint64_t nfunc = 0;
  // textStart as stored in the file (1.18+ only). 0 in position-independent
  // binaries, where the dynamic loader fills it in at run time.
  uint64_t text_start = 0;
  // All offsets are from the table start.
  uint64_t funcname_offset = 0;  // names; 0 before 1.16 (names are table offsets)
  uint64_t functab_offset = 0;   // the {entry, funcoff} pairs
  uint64_t funcdata_offset = 0;  // base of funcoff (== functab since 1.16, 0 before)
  uint64_t pctab_offset = 0;     // base of the pc-value tables (pcsp, ...); 0 before 1.16
};

// Checks the header fields (magic, padding, quantum, pointer size, offsets
// inside `data`). Cheap; used to validate a candidate found by magic.
Result<GoPclntabHeader> ParseGoPclntabHeader(std::span<const uint8_t> data);

// Byte offset of the first plausible pclntab inside `region` (for stripped Go
// binaries linked externally, where .gopclntab is merged into .data.rel.ro).
// A candidate must pass ParseGoPclntabHeader and decode its first functions.
std::optional<size_t> FindGoPclntab(std::span<const uint8_t> region);

// Called once per function, in increasing entry order. `end` is the next
// function's entry (the module's end PC for the last one). `name` points into
// the table's bytes and is valid only during the call.
using GoFunctionVisitor = std::function<void(uint64_t entry, uint64_t end, std::string_view name)>;

// Decodes every function. For 1.18+ tables, entries are offsets from
// textStart: a non-zero header value is used as is; `text_start` (the
// module's runtime.text) replaces it only when the file holds 0, as in PIEs
// where the dynamic loader fills it in. Returns the number of functions visited.
Result<uint64_t> ForEachGoFunction(std::span<const uint8_t> data, uint64_t text_start, const GoFunctionVisitor& visit);

// One range of a function's pcsp table: at PCs [start, end) the stack
// pointer is `sp_delta` bytes below its value at the function's entry (where
// the return address is at SP); so the canonical frame address there is
// SP + sp_delta + pointer size. Exact per instruction: the compiler and the
// assembler record every SP adjustment, and the runtime's own tracebacks
// (and garbage collector) depend on it.
struct GoSpRange {
  uint64_t start = 0;
  uint64_t end = 0;
  int64_t sp_delta = 0;
};

// Called once per function, in increasing entry order, with its pcsp ranges
// (sorted, clipped to [entry, end); empty when the table is missing or does
// not decode). Valid only during the call.
using GoFrameVisitor =
    std::function<void(uint64_t entry, uint64_t end, std::string_view name, std::span<const GoSpRange> sp)>;

// As ForEachGoFunction, with each function's pcsp table decoded
// (runtime/symtab.go: pcvalue/step; _func.pcsp). A pcsp table that runs past
// the data, or does not end before the function's end, is cut where it
// stops making sense; it never makes the whole walk fail.
Result<uint64_t> ForEachGoFrame(std::span<const uint8_t> data, uint64_t text_start, const GoFrameVisitor& visit);
// As above, decoding at most `max_ranges` pcsp ranges over all functions (a
// table whose functions all share one long pcsp table describes as many rows
// as the text has bytes). Where the next function's ranges would pass it,
// the walk stops before visiting it and sets *over_cap; the Result then
// counts the functions visited.
Result<uint64_t> ForEachGoFrame(std::span<const uint8_t> data, uint64_t text_start, const GoFrameVisitor& visit,
                                uint64_t max_ranges, bool* over_cap);

}  // namespace tlsprof::symbols
