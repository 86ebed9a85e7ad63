// tlsprof-unwind-tablecheck [--reference | --compare] FILE...: builds the
// unwind table of each file and prints time, rows, FDEs and how the rows
// split by rule. For measuring by hand (bench/unwind_build_cost.py and the
// issue report quote it).
//   --reference  builds with the reference builder (libdw's interpreter,
//                reference_table.h) instead of the agent's;
//   --compare    builds with both, prints both times and the first rows where
//                they differ; exit status 1 if any table differs.
#include <fcntl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "agent/unwind/reference_table.h"
#include "agent/unwind/unwind_table.h"
#include "common/fd.h"

namespace {

using tlsprof::unwind::UnwindTable;

const char* const kKinds[] = {"rsp", "rbp", "rsp_deref", "plt", "end", "none", "reg", "rsp_reg_deref"};

void Print(const char* path, const char* what, double ms, const UnwindTable& t) {
  std::printf(
      "%s%s: %.1f ms, %zu rows (%zu KiB), %lu FDEs/functions, %lu source rows, %lu unsupported (%.2f%% of rows, "
      "%.3f%% of %lu code bytes), %lu CFI errors, %lu CFA instructions, %lu overlapping FDEs\n ",
      path, what, ms, t.rows.size(), t.rows.size() * sizeof(unwind_row) / 1024, t.fdes, t.cfi_rows, t.unsupported_rows,
      t.cfi_rows ? 100.0 * t.unsupported_rows / t.cfi_rows : 0.0,
      t.covered_bytes ? 100.0 * t.unsupported_bytes / t.covered_bytes : 0.0, t.covered_bytes, t.cfi_errors,
      t.cfi_instructions, t.overlapping_fdes);
  for (int k = 0; k < UNWIND_CFA_NR_KINDS; ++k) std::printf(" %s=%lu", kKinds[k], t.kind_rows[k]);
  std::printf("\n");
}

std::string RowText(const unwind_row& r) {
  char s[160];
  std::snprintf(s, sizeof(s), "pc %#x %s reg %u off %d add %d rbp %u/%d flags %u", r.pc, kKinds[r.cfa_kind % 8], r.reg,
                r.cfa_off, r.deref_add, r.rbp_kind, r.rbp_off, r.flags);
  return s;
}

// Prints the first differences; true if the tables are the same.
bool Compare(const char* path, const UnwindTable& ref, const UnwindTable& t) {
  bool same = ref.fdes == t.fdes && ref.cfi_rows == t.cfi_rows && ref.unsupported_rows == t.unsupported_rows &&
              ref.covered_bytes == t.covered_bytes && ref.unsupported_bytes == t.unsupported_bytes &&
              ref.cfi_errors == t.cfi_errors && ref.rows.size() == t.rows.size();
  if (!same) {
    std::printf(
        "%s: statistics differ (reference/agent): fdes %lu/%lu cfi_rows %lu/%lu unsupported %lu/%lu covered "
        "%lu/%lu unsupported_bytes %lu/%lu errors %lu/%lu rows %zu/%zu\n",
        path, ref.fdes, t.fdes, ref.cfi_rows, t.cfi_rows, ref.unsupported_rows, t.unsupported_rows, ref.covered_bytes,
        t.covered_bytes, ref.unsupported_bytes, t.unsupported_bytes, ref.cfi_errors, t.cfi_errors, ref.rows.size(),
        t.rows.size());
  }
  int shown = 0;
  for (size_t i = 0; i < std::max(ref.rows.size(), t.rows.size()) && shown < 10; ++i) {
    const bool has_ref = i < ref.rows.size(), has_t = i < t.rows.size();
    if (has_ref && has_t && std::memcmp(&ref.rows[i], &t.rows[i], sizeof(unwind_row)) == 0) continue;
    same = false;
    ++shown;
    std::printf("%s: row %zu: reference %s | agent %s\n", path, i, has_ref ? RowText(ref.rows[i]).c_str() : "-",
                has_t ? RowText(t.rows[i]).c_str() : "-");
  }
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  bool reference = false, compare = false;
  int first = 1;
  for (; first < argc && argv[first][0] == '-'; ++first) {
    if (std::strcmp(argv[first], "--reference") == 0) {
      reference = true;
    } else if (std::strcmp(argv[first], "--compare") == 0) {
      compare = true;
    } else {
      std::fprintf(stderr, "usage: %s [--reference | --compare] FILE...\n", argv[0]);
      return 2;
    }
  }
  int rc = 0;
  for (int i = first; i < argc; ++i) {
    tlsprof::UniqueFd fd(open(argv[i], O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      std::perror(argv[i]);
      rc = 1;
      continue;
    }
    auto timed = [&](auto build) {
      auto t0 = std::chrono::steady_clock::now();
      auto table = build(fd.get(), argv[i]);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return std::make_pair(std::move(table), ms);
    };
    if (compare) {
      auto [ref, ref_ms] = timed(tlsprof::unwind::BuildReferenceUnwindTable);
      auto [t, ms] = timed([](int f, const char* p) { return tlsprof::unwind::BuildUnwindTable(f, p); });
      if (!ref.ok() || !t.ok()) {
        std::printf("%s: reference %s, agent %s\n", argv[i], ref.ok() ? "ok" : ref.error().message.c_str(),
                    t.ok() ? "ok" : t.error().message.c_str());
        rc = 1;
        continue;
      }
      Print(argv[i], " (reference)", ref_ms, **ref);
      Print(argv[i], " (agent)", ms, **t);
      const bool same = Compare(argv[i], **ref, **t);
      std::printf("%s: %s; build time reference %.1f ms, agent %.1f ms (%.1fx)\n", argv[i],
                  same ? "same rows" : "ROWS DIFFER", ref_ms, ms, ms > 0 ? ref_ms / ms : 0.0);
      if (!same) rc = 1;
      continue;
    }
    // Every file gets its CFI table; a Go binary also its pclntab (pcsp) table.
    for (bool go : {false, true}) {
      auto [table, ms] = timed([&](int f, const char* p) {
        return go          ? tlsprof::unwind::BuildGoUnwindTable(f, p)
               : reference ? tlsprof::unwind::BuildReferenceUnwindTable(f, p)
                           : tlsprof::unwind::BuildUnwindTable(f, p);
      });
      if (!table.ok()) {
        if (go) continue;  // not a Go binary
        std::fprintf(stderr, "%s: %s\n", argv[i], table.error().message.c_str());
        rc = 1;
        continue;
      }
      Print(argv[i], go ? " (Go pclntab)" : reference ? " (reference)" : "", ms, **table);
    }
  }
  return rc;
}
