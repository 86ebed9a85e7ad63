// Loads one binary the way the agent does and prints load time, symbol counts
// and the RSS it cost. A manual check of the memory budget (node is ~95 MB
// with a full .symtab), not a test:
//   tlsprof-symbols-loadcheck BINARY [--all|--names-only] [--no-archive] [--no-tables]
//   tlsprof-symbols-loadcheck BINARY --tables-only [--repeat N]
// Without --all only TLS code is kept, as the agent keeps it (its name test,
// classify::IsTlsSymbol, widened by the link's layout, object_layout.h);
// --names-only keeps the names alone. --no-archive and --no-tables turn those
// sources off (binary_image.h, DebugSearch); --tables-only times the decoding
// of the library's own tables alone (library_tables.h), the fastest of N runs
// (bench/library_tables.sh).
#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "agent/classify/classify.h"
#include "agent/symbols/binary_image.h"
#include "agent/symbols/boringssl_tables.h"
#include "agent/symbols/library_tables.h"
#include "common/fd.h"
#include "common/proc_status.h"

namespace {

// --tables-only: both table readers on the file, each the fastest of
// `repeat` runs; a reader that names nothing in this file (the other
// library's) is printed only if neither does. The exit status.
int TimeTableReaders(const tlsprof::guard::ElfFile& elf, int repeat) {
  double best = 1e30, best_boring = 1e30;
  tlsprof::symbols::LibraryTablesStats st;
  tlsprof::symbols::BoringSslTablesStats bst;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto tables = tlsprof::symbols::ReadLibraryTables(elf);
    auto t1 = std::chrono::steady_clock::now();
    auto boring = tlsprof::symbols::ReadBoringSslTables(elf);
    auto t2 = std::chrono::steady_clock::now();
    if (!tables || !boring) {
      std::fprintf(stderr, "error: %s\n", (!tables ? tables.error() : boring.error()).message.c_str());
      return 1;
    }
    st = tables->stats;
    bst = boring->stats;
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    best_boring = std::min(best_boring, std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  if (st.functions != 0 || bst.functions == 0) {
    std::printf(
        "%s: %llu algorithms in %llu tables, %llu curves, %llu EC methods, %llu cipher hw structs, %llu functions "
        "named (%llu below the providers); decode %.1f ms (fastest of %d)\n",
        elf.path().c_str(), static_cast<unsigned long long>(st.algorithms), static_cast<unsigned long long>(st.tables),
        static_cast<unsigned long long>(st.curves), static_cast<unsigned long long>(st.ec_methods),
        static_cast<unsigned long long>(st.hw_structs), static_cast<unsigned long long>(st.functions),
        static_cast<unsigned long long>(st.code_functions), best, repeat);
  }
  if (bst.functions != 0) {
    std::printf(
        "%s: %llu getters and %llu curves, %llu slots, %llu functions named (%llu without an FDE); method-table "
        "decode %.1f ms (fastest of %d)\n",
        elf.path().c_str(), static_cast<unsigned long long>(bst.getters), static_cast<unsigned long long>(bst.curves),
        static_cast<unsigned long long>(bst.slots), static_cast<unsigned long long>(bst.functions),
        static_cast<unsigned long long>(bst.no_extent), best_boring, repeat);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool all = false, names_only = false, no_archive = false, no_tables = false, tables_only = false;
  int repeat = 10;
  bool bad = argc < 2;
  for (int i = 2; i < argc && !bad; ++i) {
    std::string_view a = argv[i];
    if (a == "--all") {
      all = true;
    } else if (a == "--names-only") {
      names_only = true;
    } else if (a == "--no-archive") {
      no_archive = true;
    } else if (a == "--no-tables") {
      no_tables = true;
    } else if (a == "--tables-only") {
      tables_only = true;
    } else if (a == "--repeat" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      repeat = std::atoi(argv[++i]);
    } else {
      bad = true;
    }
  }
  if (bad) {
    std::fprintf(stderr,
                 "usage: %s BINARY [--all|--names-only] [--no-archive] [--no-tables]\n"
                 "       %s BINARY --tables-only [--repeat N]\n",
                 argv[0], argv[0]);
    return 2;
  }
  auto file = tlsprof::guard::OpenHostFile(argv[1]);
  if (!file) {
    std::fprintf(stderr, "%s\n", file.error().message.c_str());
    return 1;
  }
  if (tables_only) {
    auto elf = tlsprof::guard::ElfFile::Open(*file);
    if (!elf) {
      std::fprintf(stderr, "%s\n", elf.error().message.c_str());
      return 1;
    }
    return TimeTableReaders(*elf, repeat);
  }
  tlsprof::symbols::LoadOptions options;
  if (!all) {
    options.keep = tlsprof::classify::IsTlsSymbol;
    options.keep_whole_objects = !names_only;
  }
  if (no_archive) options.debug.static_archive_sonames.clear();
  options.debug.library_tables = !no_tables;
  long rss_before = tlsprof::ProcSelfStatusNumber("VmRSS:");
  long hwm_before = tlsprof::ProcSelfStatusNumber("VmHWM:");
  auto t0 = std::chrono::steady_clock::now();
  auto image = tlsprof::symbols::LoadBinaryImage(*file, tlsprof::symbols::ImageOrigin{argv[1], nullptr}, options);
  auto t1 = std::chrono::steady_clock::now();
  if (!image) {
    std::fprintf(stderr, "error: %s\n", image.error().message.c_str());
    return 1;
  }
  long rss_after = tlsprof::ProcSelfStatusNumber("VmRSS:");
  long hwm_after = tlsprof::ProcSelfStatusNumber("VmHWM:");
  const auto& img = **image;
  std::printf("%s: build-id %s, source %s, %llu function symbols seen, %zu kept, go=%d\n", argv[1],
              img.build_id.c_str(), std::string(tlsprof::symbols::SymbolSourceName(img.symbol_source)).c_str(),
              static_cast<unsigned long long>(img.symbols_seen), img.symbols.size(), img.is_go);
  std::printf("load time %.1f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
  std::printf("RSS before %ld KiB, after %ld KiB (+%ld), peak before %ld KiB, peak after %ld KiB (+%ld)\n", rss_before,
              rss_after, rss_after - rss_before, hwm_before, hwm_after, hwm_after - hwm_before);
  return 0;
}
