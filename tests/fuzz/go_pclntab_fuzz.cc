// Go's .gopclntab (agent/symbols/go_pclntab.h): the header, the search by
// magic that stripped, externally linked Go binaries need, and the function
// and pcsp walks (names for symbols, SP deltas for the Go unwind rows).
//
// Input: the table's bytes. Both text_start choices are tried (the header's
// own, and a runtime.text for PIEs whose header holds 0).
#include <cstddef>
#include <cstdint>
#include <span>

#include "agent/symbols/go_pclntab.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::symbols;
  std::span<const uint8_t> bytes(data, size);
  (void)ParseGoPclntabHeader(bytes);
  if (auto at = FindGoPclntab(bytes)) bytes = bytes.subspan(*at);
  [[maybe_unused]] size_t functions = 0;
  for (uint64_t text_start : {uint64_t{0}, uint64_t{0x401000}}) {
    (void)ForEachGoFunction(bytes, text_start, [&](uint64_t entry, uint64_t end, std::string_view) {
      if (end < entry) __builtin_trap();  // the header promises end >= entry
      ++functions;
    });
    (void)ForEachGoFrame(bytes, text_start,
                         [&](uint64_t entry, uint64_t end, std::string_view, std::span<const GoSpRange> sp) {
                           // The header promises sorted ranges clipped to [entry, end).
                           uint64_t pc = entry;
                           for (const GoSpRange& r : sp) {
                             if (r.start < pc || r.end > end || r.start >= r.end) __builtin_trap();
                             pc = r.end;
                           }
                           ++functions;
                         });
  }
  return 0;
}
