// tlsprof-unwind-tablecheck FILE...: builds the unwind table of each file and
// prints time, rows, FDEs and how the rows split by rule. For measuring by
// hand (bench/ and the issue report quote it).
#include <fcntl.h>

#include <chrono>
#include <cstdio>

#include "agent/unwind/unwind_table.h"
#include "common/fd.h"

int main(int argc, char** argv) {
  static const char* kKinds[] = {"rsp", "rbp", "rsp_deref", "plt", "end", "none", "reg", "rsp_reg_deref"};
  int rc = 0;
  for (int i = 1; i < argc; ++i) {
    tlsprof::UniqueFd fd(open(argv[i], O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      std::perror(argv[i]);
      rc = 1;
      continue;
    }
    // Every file gets its CFI table; a Go binary also its pclntab (pcsp) table.
    for (bool go : {false, true}) {
      auto t0 = std::chrono::steady_clock::now();
      auto table = go ? tlsprof::unwind::BuildGoUnwindTable(fd.get(), argv[i])
                      : tlsprof::unwind::BuildUnwindTable(fd.get(), argv[i]);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!table.ok()) {
        if (go) continue;  // not a Go binary
        std::fprintf(stderr, "%s: %s\n", argv[i], table.error().message.c_str());
        rc = 1;
        continue;
      }
      const auto& t = **table;
      std::printf(
          "%s%s: %.1f ms, %zu rows (%zu KiB), %lu %s, %lu source rows, %lu unsupported (%.2f%% of rows, %.3f%% of "
          "%lu code bytes), %lu CFI errors\n ",
          argv[i], go ? " (Go pclntab)" : "", ms, t.rows.size(), t.rows.size() * sizeof(unwind_row) / 1024, t.fdes,
          go ? "functions" : "FDEs", t.cfi_rows, t.unsupported_rows,
          t.cfi_rows ? 100.0 * t.unsupported_rows / t.cfi_rows : 0.0,
          t.covered_bytes ? 100.0 * t.unsupported_bytes / t.covered_bytes : 0.0, t.covered_bytes, t.cfi_errors);
      for (int k = 0; k < UNWIND_CFA_NR_KINDS; ++k) std::printf(" %s=%lu", kKinds[k], t.kind_rows[k]);
      std::printf("\n");
    }
  }
  return rc;
}
