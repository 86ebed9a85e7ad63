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

namespace {

// The bytes a table build reads and holds at its peak, from the file's
// headers: its CFI sections (inflated), its pclntab, and rows for them.
uint64_t TablePlanBytes(const guard::ElfFile& elf) {
  uint64_t bytes = 0;
  for (const guard::ElfSection& s : elf.sections()) {
    if (s.name == ".eh_frame" || s.name == ".debug_frame" || s.name == ".gopclntab" ||
        s.name == ".data.rel.ro.gopclntab") {
      bytes += s.shdr.sh_size;
    }
  }
  return 3 * bytes;  // the sections, and rows of at most about twice their bytes
}

}  // namespace

// The table build, run on the deadline worker: everything it touches it owns.
void UnwindRegistrar::BuildRows(TableJob& job) {
  const discovery::ImageInfo& info = *job.info;
  auto elf = guard::ElfFile::Open(*info.file);
  if (!elf.ok()) {
    job.error = elf.error().message;
    return;
  }
  if (job.budget) {
    const uint64_t cost = TablePlanBytes(*elf);
    if (!job.budget->Admit(cost)) {
      job.budget->Skipped(guard::MemoryBudget::kUnwindTable, info.path, cost);
      job.refused = true;
      return;
    }
  }
  struct TrimAfterLoad {
    guard::MemoryBudget* budget;
    uint64_t file_bytes;
    ~TrimAfterLoad() {
      if (budget != nullptr) budget->AfterLoad(file_bytes);
    }
  } trim{job.budget.get(), info.file->size()};  // at return, once the table and its copies are gone
  // Go: rows from the pclntab's pcsp tables, not frame pointers (see
  // agent/unwind/go_table.cc); without a usable pclntab, Register falls back
  // to frame pointers.
  const bool go = info.image->is_go;
  auto table = go ? unwind::BuildGoUnwindTable(*elf, info.path) : unwind::BuildUnwindTable(*elf, info.path);
  if (!table.ok()) {
    job.error = table.error().message;
    return;
  }
  // The whole table, also for a binary that links its TLS library
  // statically: the walk from a TLS leaf up to the operation entry passes
  // through library functions with names too generic for the rules table
  // (do_*, get_*), and node's 372k rows are 6 MiB of the 32 MiB row array.
  // There, rows inside TLS symbols are flagged, so that the BPF unwinder
  // gives node's own code only the cheap first walk.
  const bool static_tls = info.tls && !info.tls->whole_file_is_tls;
  job.rows = static_tls && !go ? FlagTlsRows(**table, info.image->symbols) : (*table)->rows;
  // A Go binary's rows are all flagged, as its frame-pointer walk was: the
  // runtime code that crypto calls (mallocgc, memmove, GC assists) is not in
  // a TLS symbol, and the walk from there must reach the crypto frames.
  if (go && info.tls) {
    for (unwind_row& r : job.rows) r.flags |= UNWIND_ROW_TLS;
  }
}

UnwindRegistrar::Slot UnwindRegistrar::TableFor(pid_t pid, const ProcessSnapshot::ExecMapping& m) {
  const discovery::ImageInfo* info = m.image.get();
  // One table per image: copies of one file in several containers share
  // their image (symbols::ImageCache) and so their rows.
  const symbols::BinaryImage* key = info->image.get();
  if (auto it = slots_.find(key); it != slots_.end()) return it->second.second;
  if (!info->file) {
    ++stats_.table_failures;
    return Slot{};
  }
  std::shared_ptr<TableJob> job;
  if (auto pending = pending_.find(key); pending != pending_.end()) {
    if (!pending->second.job->done) {
      pending->second.pids.insert(pid);
      return Slot{};  // still building: walked without a table for now
    }
    job = std::move(pending->second.job);
    pending_.erase(pending);
  } else {
    job = std::make_shared<TableJob>();
    job->info = m.image;
    job->budget = budget_;
    auto build = [job] {
      BuildRows(*job);
      job->done = true;
    };
    if (worker_ == nullptr) {
      build();
    } else if (!worker_->Run(build, guard::WaitUntil(deadline_, wait_),
                             fmt::format("the unwind table of {}", info->path))) {
      pending_[key].job = job;
      pending_[key].pids.insert(pid);
      return Slot{};
    }
  }
  return Upload(key, *job);
}

std::vector<pid_t> UnwindRegistrar::TakeBuilt() {
  std::vector<pid_t> out;
  for (auto& [key, pending] : pending_) {
    if (!pending.job->done || pending.pids.empty()) continue;
    out.insert(out.end(), pending.pids.begin(), pending.pids.end());
    pending.pids.clear();  // the entry stays until a Register uploads it
  }
  return out;
}

// Uploads a built table's rows (the sampler is the loop thread's) and keeps
// its slot; a table that failed keeps an empty one, so it is not built again.
UnwindRegistrar::Slot UnwindRegistrar::Upload(const symbols::BinaryImage* key, TableJob& job) {
  const discovery::ImageInfo& info = *job.info;
  Slot slot;
  if (job.refused) {
    ++stats_.tables_over_budget;
    return slot;  // not kept: tried again at the next registration that maps it
  }
  if (!job.error.empty() || job.rows.empty() || job.rows.size() > UINT32_MAX) {
    ++stats_.table_failures;
    if (!job.error.empty()) spdlog::debug("unwind: no table for {}: {}", info.path, job.error);
    slots_.emplace(key, std::make_pair(info.image, slot));
    return slot;
  }
  auto first = sampler_.AllocateRows(static_cast<uint32_t>(job.rows.size()));
  auto uploaded = first.ok() ? sampler_.UploadRows(*first, job.rows) : Status(first.error());
  const size_t rows = job.rows.size();
  std::vector<unwind_row>().swap(job.rows);
  if (!uploaded.ok()) {
    ++stats_.table_failures;
    spdlog::warn("unwind: no table for {} ({} rows): {}", info.path, rows, uploaded.error().message);
    slots_.emplace(key, std::make_pair(info.image, slot));
    return slot;
  }
  slot.first_row = *first;
  slot.rows = static_cast<uint32_t>(rows);
  ++stats_.tables;
  stats_.rows += slot.rows;
  slots_.emplace(key, std::make_pair(info.image, slot));
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
    Slot slot = TableFor(pid, m);
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
