// Appending rows to an UnwindTable, for the two table builders
// (unwind_table.cc from CFI, go_table.cc from the pclntab). Internal to
// tlsprof::unwind.
#pragma once

#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {

// Nothing is known there: the unwinder stops.
inline unwind_row NoneRow() {
  unwind_row row{};
  row.cfa_kind = CFA_NONE;
  row.rbp_kind = RBP_LOST;
  return row;
}

// The frame-pointer rule: CFA = RBP + 16, the caller's RBP at CFA - 16.
inline unwind_row FramePointerRow() {
  unwind_row row{};
  row.cfa_kind = CFA_RBP;
  row.cfa_off = 16;
  row.rbp_kind = RBP_AT_CFA;
  row.rbp_off = -16;
  return row;
}

inline bool SameRule(const unwind_row& a, const unwind_row& b) {
  return a.cfa_kind == b.cfa_kind && a.reg == b.reg && a.flags == b.flags && a.rbp_kind == b.rbp_kind &&
         a.cfa_off == b.cfa_off && a.deref_add == b.deref_add && a.rbp_off == b.rbp_off;
}

// Appends rows in PC order. A row at the last row's PC replaces it (the
// earlier one covered an empty range: the later rule wins); a row with the
// last row's rule is dropped (the range goes on).
class RowBuilder {
 public:
  explicit RowBuilder(UnwindTable* t) : t_(t) {}

  void Add(uint64_t pc, unwind_row row) {
    row.pc = static_cast<uint32_t>(pc);
    auto& rows = t_->rows;
    if (!rows.empty() && rows.back().pc == row.pc) rows.pop_back();
    if (!rows.empty() && SameRule(rows.back(), row)) return;
    rows.push_back(row);
  }
  void AddNone(uint64_t pc) { Add(pc, NoneRow()); }

  // Counts the final rows by kind (UnwindTable::kind_rows); after the last Add.
  void Finish() {
    for (const unwind_row& row : t_->rows) ++t_->kind_rows[row.cfa_kind];
  }

 private:
  UnwindTable* t_;
};

}  // namespace tlsprof::unwind
