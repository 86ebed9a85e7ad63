// The reference unwinder (see unwind_table.h for the algorithm); the BPF
// program in bpf/ implements the same steps and is tested against this.
#include "agent/unwind/unwind_table.h"

namespace tlsprof::unwind {
namespace {

const MappedTable* FindMapping(const std::vector<MappedTable>& mappings, uint64_t ip) {
  for (const MappedTable& m : mappings) {
    if (ip >= m.start && ip < m.end) return &m;
  }
  return nullptr;
}

// One step: the caller's registers from the callee's, or why not.
// `sample_gpr` is non-null while the sample's registers are still trusted
// (CFA_REG rows, see unwind.h).
std::optional<UnwindStop> Step(const MappedTable& m, uint64_t lookup, Registers* regs, bool* bp_known,
                               const uint64_t* sample_gpr, ReadWord read, void* ctx) {
  uint64_t cfa = 0, ra = 0, bp = regs->bp;
  if (m.table == nullptr || m.table->rows.empty()) {
    // Frame pointers (Go, or a binary without CFI): the BPF side's table_len 0.
    if (!*bp_known) return UnwindStop::kBpUnknown;
    if (!read(ctx, regs->bp + 8, &ra) || !read(ctx, regs->bp, &bp)) return UnwindStop::kUnreadable;
    cfa = regs->bp + 16;
  } else {
    const unwind_row* row = FindRow(*m.table, lookup - m.bias);
    if (!row) return UnwindStop::kNoRow;
    switch (row->cfa_kind) {
      case CFA_RSP:
        cfa = regs->sp + int64_t(row->cfa_off);
        break;
      case CFA_RBP:
        if (!*bp_known) return UnwindStop::kBpUnknown;
        cfa = regs->bp + int64_t(row->cfa_off);
        break;
      case CFA_RSP_DEREF:
        // The slot may lie below RSP (perlasm uses the red zone: rsp-8).
        if (!read(ctx, regs->sp + int64_t(row->cfa_off), &cfa)) return UnwindStop::kUnreadable;
        cfa += int64_t(row->deref_add);
        break;
      case CFA_PLT:
        cfa = regs->sp + 8 + ((regs->ip & 15) >= 11 ? 8 : 0);
        break;
      case CFA_REG:
        if (!sample_gpr || row->reg >= 16) return UnwindStop::kRegUnknown;
        cfa = sample_gpr[row->reg] + int64_t(row->cfa_off);
        if (cfa <= regs->sp || cfa - regs->sp > UNWIND_CFA_REG_MAX_DIST || (cfa & 7) != 0) {
          return UnwindStop::kRegUnknown;
        }
        break;
      case CFA_RSP_REG_DEREF:
        if (!sample_gpr || row->reg >= 16) return UnwindStop::kRegUnknown;
        if (!read(ctx, regs->sp + int64_t(row->cfa_off) + sample_gpr[row->reg] * 8, &cfa)) {
          return UnwindStop::kUnreadable;
        }
        cfa += int64_t(row->deref_add);
        if (cfa <= regs->sp || cfa - regs->sp > UNWIND_CFA_REG_MAX_DIST || (cfa & 7) != 0) {
          return UnwindStop::kRegUnknown;
        }
        break;
      case CFA_END:
        return UnwindStop::kEnd;
      default:
        return UnwindStop::kNoCfi;
    }
    if (!read(ctx, cfa - 8, &ra)) return UnwindStop::kUnreadable;
    if (row->rbp_kind == RBP_AT_CFA) {
      if (!read(ctx, cfa + int64_t(row->rbp_off), &bp)) return UnwindStop::kUnreadable;
      *bp_known = true;
    } else if (row->rbp_kind == RBP_LOST) {
      *bp_known = false;
    }
  }
  if (cfa <= regs->sp) return UnwindStop::kNotGrowing;  // or we could loop
  *regs = Registers{ra, cfa, bp};
  return std::nullopt;
}

}  // namespace

UnwindResult UnwindWithReason(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                              size_t max_frames) {
  UnwindResult r;
  bool bp_known = true;
  const Registers sample = regs;
  const MappedTable* prev = nullptr;  // frame 0's mapping
  for (size_t depth = 0;; ++depth) {
    if (regs.ip == 0) {
      r.stop = UnwindStop::kZeroIp;
      break;
    }
    if (r.frames.size() >= max_frames) {
      r.stop = UnwindStop::kMaxFrames;
      break;
    }
    r.frames.push_back(regs.ip);
    // A return address points after the call, maybe past the caller's end.
    const uint64_t lookup = depth == 0 ? regs.ip : regs.ip - 1;
    const MappedTable* m = FindMapping(mappings, lookup);
    if (!m) {
      r.stop = UnwindStop::kNoMapping;
      break;
    }
    // The sample's registers hold at frame 0, and at frame 1 when frame 0
    // was a leaf of the same file (perlasm leaves keep the caller's CFA
    // register).
    const bool gpr_known = depth == 0 || (depth <= UNWIND_CFA_REG_MAX_FRAME && m == prev);
    if (std::optional<UnwindStop> stop =
            Step(*m, lookup, &regs, &bp_known, gpr_known ? sample.gpr : nullptr, read, ctx)) {
      r.stop = *stop;
      break;
    }
    prev = m;
  }
  return r;
}

std::vector<uint64_t> Unwind(const std::vector<MappedTable>& mappings, Registers regs, ReadWord read, void* ctx,
                             size_t max_frames) {
  return UnwindWithReason(mappings, regs, read, ctx, max_frames).frames;
}

}  // namespace tlsprof::unwind
