// Object layout of a static link: which functions of a .symtab belong to the
// same object files as the functions a name filter selected.
//
// Why: in a binary that links libcrypto.a (or a program like node that builds
// OpenSSL in), the TLS library is told apart from the program by symbol names
// (LoadOptions::keep). Library-internal helpers with generic names (OpenSSL's
// `getrn`, `bn2binpad`, `copy_conditional`, `do_name`) fail the name test,
// yet they run inside TLS operations. The linker lays each object file's code
// out contiguously, in link order, and .symtab lists each object's local
// symbols after an STT_FILE symbol; together they tell which object a helper
// came from.
//
// Rules, in order (figures: bench/README.md, "Static links: the library's
// own helpers"):
//  1. Split-off cold parts (`foo.cold`) sit in .text.unlikely, away from their
//     object. They are set aside and follow their parent by name.
//  2. A segment is a run of address-consecutive locals of one object plus the
//     globals between them: the same object's code. A segment that holds a
//     selected function is selected whole.
//  3. A run of unselected functions between two selected ones whose locals
//     come from at most one object is selected: an object (or an object's
//     edge) inside the library's block of the link. Runs that mix objects (a
//     program's code between libssl.a and libcrypto.a, libstdc++'s cold
//     parts) are not.
// A global with no local next to it in its object and an object linked
// between two library objects with at most one file of locals are where the
// rules can be wrong; both are rare in real link orders.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace tlsprof::symbols {

struct LinkedFunction {
  uint64_t addr = 0;
  uint64_t size = 0;
  std::string_view name;
  int32_t object = -1;    // index of the STT_FILE before a local symbol; -1 for a global
  bool selected = false;  // in: chosen by name; out: also chosen by layout
};

// Sets `selected` on the functions that share object files with selected
// ones (rules above). The order of `functions` is kept.
void SelectWholeObjects(std::vector<LinkedFunction>& functions);

}  // namespace tlsprof::symbols
