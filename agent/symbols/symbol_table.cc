#include "agent/symbols/symbol_table.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace tlsprof::symbols {

void SymbolTable::Add(uint64_t addr, uint64_t size, std::string_view name) {
  symbols_.push_back(Symbol{addr, size, std::string(name)});
}

void SymbolTable::Finalize() {
  // Drop exact duplicates (same address and name, e.g. from .symtab and
  // .dynsym), keeping the largest size in case one copy lacks it.
  std::sort(symbols_.begin(), symbols_.end(), [](const Symbol& a, const Symbol& b) {
    return std::tie(a.addr, a.name, b.size) < std::tie(b.addr, b.name, a.size);
  });
  symbols_.erase(std::unique(symbols_.begin(), symbols_.end(),
                             [](const Symbol& a, const Symbol& b) { return a.addr == b.addr && a.name == b.name; }),
                 symbols_.end());
  // Lookup order: by address, and among aliases at one address the larger one
  // first, so the smaller (more specific) one is pushed later and wins where
  // both apply. Among equal aliases the alphabetically first name is pushed
  // last and wins, so results do not depend on file order.
  std::sort(symbols_.begin(), symbols_.end(), [](const Symbol& a, const Symbol& b) {
    return std::tie(a.addr, b.size, b.name) < std::tie(b.addr, a.size, a.name);
  });
  symbols_.shrink_to_fit();
  // Indices are uint32_t; a table this big cannot come from a real binary.
  if (symbols_.size() >= kNoSymbol) symbols_.resize(kNoSymbol - 1);

  range_start_.clear();
  range_symbol_.clear();
  auto emit = [this](uint64_t start, uint32_t symbol) {
    if (!range_start_.empty() && range_start_.back() == start) {
      range_symbol_.back() = symbol;  // a later symbol starting here wins
      if (range_symbol_.size() >= 2 && range_symbol_[range_symbol_.size() - 2] == symbol) {
        range_start_.pop_back();
        range_symbol_.pop_back();
      }
      return;
    }
    if (!range_symbol_.empty() && range_symbol_.back() == symbol) return;
    range_start_.push_back(start);
    range_symbol_.push_back(symbol);
  };
  auto end_of = [this](uint32_t i) {
    const Symbol& s = symbols_[i];
    // Clamp instead of wrapping: a bogus size must not make a symbol cover
    // low addresses.
    return s.addr > std::numeric_limits<uint64_t>::max() - s.size ? std::numeric_limits<uint64_t>::max()
                                                                  : s.addr + s.size;
  };

  // Sweep by start address. The stack holds the symbols covering the current
  // position, latest start on top; the top is the winner ("highest start that
  // still contains the address"). Entries below the top may already have
  // ended; they are discarded when they surface.
  std::vector<uint32_t> stack;
  auto retire_until = [&](uint64_t pos) {
    while (!stack.empty() && end_of(stack.back()) <= pos) {
      uint64_t end = end_of(stack.back());
      stack.pop_back();
      while (!stack.empty() && end_of(stack.back()) <= end) stack.pop_back();
      emit(end, stack.empty() ? kNoSymbol : stack.back());
    }
  };
  for (uint32_t i = 0; i < symbols_.size(); ++i) {
    if (symbols_[i].size == 0) continue;  // unknown extent: never matched
    retire_until(symbols_[i].addr);
    stack.push_back(i);
    emit(symbols_[i].addr, i);
  }
  retire_until(std::numeric_limits<uint64_t>::max());
  range_start_.shrink_to_fit();
  range_symbol_.shrink_to_fit();
}

std::optional<uint32_t> SymbolTable::Find(uint64_t vaddr) const {
  auto it = std::upper_bound(range_start_.begin(), range_start_.end(), vaddr);
  if (it == range_start_.begin()) return std::nullopt;
  uint32_t symbol = range_symbol_[static_cast<size_t>(it - range_start_.begin()) - 1];
  if (symbol == kNoSymbol) return std::nullopt;
  return symbol;
}

}  // namespace tlsprof::symbols
