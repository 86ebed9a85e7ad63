// tlsprof-hostile: a hostile tenant of the host, for the agent's hostile-input
// test (tests/integration/test_hostile.py; workloads/README.md). One static
// program, so that it runs unchanged inside any container root:
//
//   gen-*, copy-build-id, crafted-symtab  write crafted ELF files (crafted_elf.h)
//   tenant, fifo-swap, truncate-loop, many-maps  the processes that map them and
//                                         do what tenant.h says, as an unprivileged user
//
// Exit 0; 1 with the reason on stderr if a file or mapping could not be made.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "crafted_elf.h"
#include "tenant.h"

namespace {

void AddCommon(CLI::App* app, tlsprof::hostile::Common& c) {
  app->add_option("--map", c.map, "Also map this ELF file's segments for the whole run (repeatable)");
  app->add_option("--seconds", c.seconds, "Stop after this many seconds (0: at SIGTERM)");
  app->add_option("--duty", c.duty, "Share of each 20 ms slice spent burning CPU")->check(CLI::Range(0.01, 1.0));
  app->add_option("--ready-file", c.ready, "Written (with the pid) once everything is mapped");
  app->add_option("--status", c.status, "A JSON object of what was done, rewritten as it goes");
}

}  // namespace

int main(int argc, char** argv) {
  namespace h = tlsprof::hostile;
  CLI::App app{"A hostile tenant: crafted ELF files, and processes that map them"};
  app.require_subcommand(1);
  std::string out, in, hex, prefix = "ossl_ml_kem_poison_", library, dir, path, file;
  uint64_t count = 0, size_gib = 64, text_mib = 16, functions = 8192;
  int fillers = 3000, spawn_ms = 1000, maps = 60000;
  double hold = 2.0;
  h::Common common;

  auto* sparse = app.add_subcommand("gen-sparse", "A sparse ELF whose sections claim gigabytes of holes");
  sparse->add_option("out", out)->required();
  sparse->add_option("--size-gib", size_gib, "File size")->capture_default_str();
  auto* symbols = app.add_subcommand("gen-symbols", "An ELF with COUNT SSL_* function symbols in .symtab");
  symbols->add_option("out", out)->required();
  symbols->add_option("--count", count, "Symbols")->required();
  auto* fde = app.add_subcommand("gen-fde", "An ELF whose one FDE has ROWS rows");
  fde->add_option("out", out)->required();
  fde->add_option("--rows", count, "Rows")->required();
  auto* pclntab = app.add_subcommand("gen-pclntab", "A Go ELF whose functions share one pcsp table");
  pclntab->add_option("out", out)->required();
  pclntab->add_option("--text-mib", text_mib, "Code size")->capture_default_str();
  pclntab->add_option("--functions", functions, "Functions")->capture_default_str();
  auto* build_id = app.add_subcommand("copy-build-id", "Copy an ELF file with another GNU build-id");
  build_id->add_option("in", in)->required();
  build_id->add_option("out", out)->required();
  build_id->add_option("--build-id", hex, "Hex, as many bytes as the original's")->required();
  auto* symtab =
      app.add_subcommand("crafted-symtab", "Copy an ELF file with a .symtab that names all its code wrongly");
  symtab->add_option("in", in)->required();
  symtab->add_option("out", out)->required();
  symtab->add_option("--prefix", prefix, "Every symbol is PREFIX<n>")->capture_default_str();
  symtab->add_option("--build-id", hex, "Also replace the build-id (hex)");

  auto* tenant = app.add_subcommand("tenant", "Map files and burn CPU");
  AddCommon(tenant, common);
  auto* fifo = app.add_subcommand("fifo-swap", "Swap a mapped library for a FIFO once the profiler opens it");
  AddCommon(fifo, common);
  fifo->add_option("--library", library, "The library copied each round")->required();
  fifo->add_option("--dir", dir, "A writable directory for the copies")->required();
  fifo->add_option("--fillers", fillers, "One-page mappings read after the copy")->capture_default_str();
  fifo->add_option("--hold", hold, "Seconds a round goes on after the swap")->capture_default_str();
  auto* truncate = app.add_subcommand("truncate-loop", "Truncate and restore a library while new processes map it");
  AddCommon(truncate, common);
  truncate->add_option("--library", library, "The library copied to PATH")->required();
  truncate->add_option("--path", path, "Where the copy lives")->required();
  truncate->add_option("--spawn-ms", spawn_ms, "A new mapping process every this often")->capture_default_str();
  auto* many = app.add_subcommand("many-maps", "Map one page of a file at many addresses");
  AddCommon(many, common);
  many->add_option("--file", file, "An ELF file with an executable segment")->required();
  many->add_option("--count", maps, "Mappings")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*sparse) h::WriteSparseElf(out, size_gib << 30);
    if (*symbols) h::WriteManySymbolsElf(out, count);
    if (*fde) h::WriteLongFdeElf(out, count);
    if (*pclntab) h::WriteSharedPcspGoElf(out, text_mib << 20, functions);
    if (*build_id) h::CopyWithBuildId(in, out, hex);
    if (*symtab) h::CopyWithCraftedSymtab(in, out, prefix, hex);
    if (*tenant) return h::RunTenant(common);
    if (*fifo) return h::RunFifoSwap(common, library, dir, fillers, hold);
    if (*truncate) return h::RunTruncateLoop(common, library, path, spawn_ms);
    if (*many) return h::RunManyMaps(common, file, maps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tlsprof-hostile: %s\n", e.what());
    return 1;
  }
  return 0;
}
