// The reference unwinder (see unwind_table.h for the algorithm); the BPF
// program in bpf/ implements the same steps and is tested against this.
#include <algorithm>

#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {
namespace {

const MappedTable* FindMapping(const std::vector<MappedTable>& mappings, uint64_t ip) {
  for (const MappedTable& m : mappings) {
    if (ip >= m.start && ip < m.end) return &m;
  }
  return nullptr;
}

}  // namespace

std::vector<uint64_t> Unwind(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                             size_t max_frames) {
  std::vector<uint64_t> frames;
  bool bp_known = true;
  for (size_t depth = 0; regs.ip != 0 && frames.size() < max_frames; ++depth) {
    frames.push_back(regs.ip);
    if (frames.size() == max_frames) break;
    const uint64_t lookup = depth == 0 ? regs.ip : regs.ip - 1;
    const MappedTable* m = FindMapping(mappings, lookup);
    if (!m) break;

    uint64_t cfa = 0, ra = 0, bp = regs.bp;
    if (m->table == nullptr || m->table->rows.empty()) {
      // Frame pointers (Go, or a binary without CFI).
      if (!bp_known) break;
      if (!read(ctx, regs.bp + 8, &ra) || !read(ctx, regs.bp, &bp)) break;
      cfa = regs.bp + 16;
    } else {
      const unwind_row* row = FindRow(*m->table, lookup - m->bias);
      if (!row) break;
      switch (row->cfa_kind) {
        case CFA_RSP:
          cfa = regs.sp + int64_t(row->cfa_off);
          break;
        case CFA_RBP:
          if (!bp_known) return frames;
          cfa = regs.bp + int64_t(row->cfa_off);
          break;
        case CFA_RSP_DEREF:
          if (!read(ctx, regs.sp + int64_t(row->cfa_off), &cfa)) return frames;
          cfa += int64_t(row->deref_add);
          break;
        case CFA_PLT:
          cfa = regs.sp + 8 + ((regs.ip & 15) >= 11 ? 8 : 0);
          break;
        default:  // CFA_END, CFA_NONE
          return frames;
      }
      if (!read(ctx, cfa - 8, &ra)) break;
      if (row->rbp_kind == RBP_AT_CFA) {
        if (!read(ctx, cfa + int64_t(row->rbp_off), &bp)) break;
        bp_known = true;
      } else if (row->rbp_kind == RBP_LOST) {
        bp_known = false;
      }
    }
    if (cfa <= regs.sp) break;  // the stack must grow, or we would loop
    regs = Registers{ra, cfa, bp};
  }
  return frames;
}

}  // namespace tlsprof::unwind
