// SymbolTable: function symbols of one binary, sorted by address.
//
// Lookup respects symbol sizes: an address is attributed to a symbol only if
// it lies inside [addr, addr + size). An address in a gap between symbols, or
// past the end of a symbol with size 0, is not attributed to a neighbour.
// Immutable after Finalize(); concurrent const access is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tlsprof::symbols {

struct Symbol {
  uint64_t addr = 0;  // ELF virtual address (st_value / Go entry PC)
  uint64_t size = 0;  // bytes; 0 means unknown extent (never matched)
  std::string name;
};

class SymbolTable {
 public:
  void Add(uint64_t addr, uint64_t size, std::string_view name);
  // Sorts, drops exact duplicates (same addr and name, e.g. a name present in
  // both .symtab and .dynsym) and prepares lookups. Must be called once after
  // the last Add().
  void Finalize();

  // Index of the symbol containing vaddr, if any. When symbols overlap (aliases
  // of one function), the one with the highest start <= vaddr that still
  // contains vaddr wins.
  std::optional<uint32_t> Find(uint64_t vaddr) const;
  const Symbol& at(uint32_t index) const { return symbols_[index]; }
  size_t size() const { return symbols_.size(); }
  bool empty() const { return symbols_.empty(); }
  const std::vector<Symbol>& all() const { return symbols_; }

 private:
  std::vector<Symbol> symbols_;
  // Finalize() flattens the (possibly overlapping) symbols into disjoint
  // ranges so Find() is one binary search, whatever the overlaps: range i
  // covers [range_start_[i], range_start_[i + 1]) and belongs to symbol
  // range_symbol_[i], or to no symbol (kNoSymbol) for a gap.
  static constexpr uint32_t kNoSymbol = UINT32_MAX;
  std::vector<uint64_t> range_start_;
  std::vector<uint32_t> range_symbol_;
};

}  // namespace tlsprof::symbols
