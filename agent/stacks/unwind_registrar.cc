#include "agent/stacks/unwind_registrar.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace tlsprof::stacks {
namespace {

using discovery::ProcessSnapshot;

bool IsLibc(const std::string& path) {
  auto slash = path.rfind('/');
  std::string_view base =
      slash == std::string::npos ? std::string_view(path) : std::string_view(path).substr(slash + 1);
  return base.starts_with("libc.so") || base.starts_with("libc-");
}

// Lower is more important when a process has more executable mappings than
// the unwinder's per-process slots.
int Priority(const ProcessSnapshot::ExecMapping& m, size_t index) {
  if (m.image && m.image->tls) return 0;
  if (index == 0) return 1;  // usually the main executable (lowest address of a non-PIE or PIE binary)
  if (IsLibc(m.mapping.path)) return 1;
  return 2;
}

}  // namespace

std::vector<unwind_row> FlagTlsRows(const unwind::UnwindTable& table, const symbols::SymbolTable& symbols) {
  // Cut the rows at every TLS symbol's start and end, then flag the pieces
  // that lie inside one.
  std::vector<uint64_t> cuts;
  cuts.reserve(table.rows.size() + 2 * symbols.size());
  for (const auto& r : table.rows) cuts.push_back(r.pc);
  for (const auto& sym : symbols.all()) {
    if (sym.size == 0 || sym.addr + sym.size > UINT32_MAX) continue;
    cuts.push_back(sym.addr);
    cuts.push_back(sym.addr + sym.size);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<unwind_row> out;
  out.reserve(cuts.size());
  for (uint64_t pc : cuts) {
    const unwind_row* base = unwind::FindRow(table, pc);
    unwind_row r{};
    if (base != nullptr) {
      r = *base;
    } else {
      r.cfa_kind = CFA_NONE;
    }
    r.pc = static_cast<uint32_t>(pc);
    r.flags = symbols.Find(pc) ? UNWIND_ROW_TLS : 0;
    if (!out.empty()) {
      const unwind_row& b = out.back();
      if (b.cfa_kind == r.cfa_kind && b.rbp_kind == r.rbp_kind && b.reg == r.reg && b.flags == r.flags &&
          b.cfa_off == r.cfa_off && b.deref_add == r.deref_add && b.rbp_off == r.rbp_off) {
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

UnwindRegistrar::Slot UnwindRegistrar::TableFor(const ProcessSnapshot::ExecMapping& m) {
  const discovery::ImageInfo* info = m.image.get();
  // One table per image: copies of one file in several containers share
  // their image (symbols::ImageCache) and so their rows.
  const symbols::BinaryImage* key = info->image.get();
  if (auto it = slots_.find(key); it != slots_.end()) return it->second.second;
  Slot slot;
  if (!info->file) {
    ++stats_.table_failures;
    return slot;
  }
  const guard::GuardedFile& file = *info->file;
  // Building a table needs about the file's CFI and its rows at its peak
  // (bench/README.md); over the cap no table is built, and the file is tried
  // again at the next registration that maps it.
  const uint64_t file_bytes = file.size();
  if (budget_ != nullptr) {
    const uint64_t cost = file_bytes;
    if (!budget_->Admit(cost)) {
      budget_->Skipped(guard::MemoryBudget::kUnwindTable, info->path, cost);
      ++stats_.tables_over_budget;
      return slot;
    }
  }
  // Go: rows from the pclntab's pcsp tables, not frame pointers (see
  // agent/unwind/go_table.cc); without a usable pclntab, Register falls back
  // to frame pointers.
  const bool go = info->image->is_go;
  struct TrimAfterLoad {
    guard::MemoryBudget* budget;
    uint64_t file_bytes;
    ~TrimAfterLoad() {
      if (budget != nullptr) budget->AfterLoad(file_bytes);
    }
  } trim{budget_, file_bytes};  // at return, once the table and its copies (declared below) are gone
  auto elf = guard::ElfFile::Open(file);
  if (!elf.ok()) {
    ++stats_.table_failures;
    spdlog::debug("unwind: no table for {}: {}", info->path, elf.error().message);
    slots_.emplace(key, std::make_pair(info->image, slot));
    return slot;
  }
  auto table = go ? unwind::BuildGoUnwindTable(*elf, info->path) : unwind::BuildUnwindTable(*elf, info->path);
  if (!table.ok()) {
    ++stats_.table_failures;
    spdlog::debug("unwind: no table for {}: {}", info->path, table.error().message);
    slots_.emplace(key, std::make_pair(info->image, slot));
    return slot;
  }
  // The whole table, also for a binary that links its TLS library
  // statically: the walk from a TLS leaf up to the operation entry passes
  // through library functions with names too generic for the rules table
  // (do_*, get_*), and node's 372k rows are 6 MiB of the 32 MiB row array.
  // There, rows inside TLS symbols are flagged, so that the BPF unwinder
  // gives node's own code only the cheap first walk.
  const bool static_tls = info->tls && !info->tls->whole_file_is_tls;
  std::vector<unwind_row> rows = static_tls && !go ? FlagTlsRows(**table, info->image->symbols) : (*table)->rows;
  // A Go binary's rows are all flagged, as its frame-pointer walk was: the
  // runtime code that crypto calls (mallocgc, memmove, GC assists) is not in
  // a TLS symbol, and the walk from there must reach the crypto frames.
  if (go && info->tls) {
    for (unwind_row& r : rows) r.flags |= UNWIND_ROW_TLS;
  }
  if (rows.empty() || rows.size() > UINT32_MAX) {
    ++stats_.table_failures;
    slots_.emplace(key, std::make_pair(info->image, slot));
    return slot;
  }
  auto first = sampler_.AllocateRows(static_cast<uint32_t>(rows.size()));
  auto uploaded = first.ok() ? sampler_.UploadRows(*first, rows) : Status(first.error());
  if (!uploaded.ok()) {
    ++stats_.table_failures;
    spdlog::warn("unwind: no table for {} ({} rows): {}", info->path, rows.size(), uploaded.error().message);
    slots_.emplace(key, std::make_pair(info->image, slot));
    return slot;
  }
  slot.first_row = *first;
  slot.rows = static_cast<uint32_t>(rows.size());
  ++stats_.tables;
  stats_.rows += slot.rows;
  slots_.emplace(key, std::make_pair(info->image, slot));
  return slot;
}

void UnwindRegistrar::Unregister(pid_t pid) { sampler_.RemoveProcess(static_cast<uint32_t>(pid)); }

Status UnwindRegistrar::Register(pid_t pid, const ProcessSnapshot& process) {
  if (!process.has_tls()) return OkStatus();
  std::vector<std::pair<int, size_t>> order;
  for (size_t i = 0; i < process.mappings.size(); ++i) {
    if (process.mappings[i].image && process.mappings[i].image->image) {
      order.emplace_back(Priority(process.mappings[i], i), i);
    }
  }
  std::stable_sort(order.begin(), order.end());
  if (order.size() > TLSPROF_UNWIND_MAX_MAPPINGS) {
    stats_.mappings_left_out += order.size() - TLSPROF_UNWIND_MAX_MAPPINGS;
    order.resize(TLSPROF_UNWIND_MAX_MAPPINGS);
  }
  std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    return process.mappings[a.second].mapping.start < process.mappings[b.second].mapping.start;
  });

  unwind_proc proc{};
  for (const auto& [priority, index] : order) {
    const auto& m = process.mappings[index];
    const discovery::ImageInfo& info = *m.image;
    auto vaddr = info.image->MappingVaddr(m.mapping.offset, /*executable=*/true);
    if (!vaddr) continue;
    unwind_mapping& um = proc.mappings[proc.nr_mappings];
    um.start = m.mapping.start;
    um.end = m.mapping.end;
    um.bias = m.mapping.start - *vaddr;
    if (info.tls) um.flags |= info.tls->whole_file_is_tls ? UNWIND_MAPPING_TLS : UNWIND_MAPPING_TLS_SYMBOLS;
    Slot slot = TableFor(m);
    um.table_start = slot.first_row;
    um.table_len = slot.rows;
    // A Go binary without a usable pclntab table: its frame pointers.
    if (info.image->is_go && slot.rows == 0) um.flags |= UNWIND_MAPPING_FP;
    ++proc.nr_mappings;
  }
  auto status = sampler_.SetProcess(static_cast<uint32_t>(pid), proc);
  if (!status.ok()) {
    ++stats_.process_failures;
    return status;
  }
  ++stats_.processes;
  return OkStatus();
}

}  // namespace tlsprof::stacks
