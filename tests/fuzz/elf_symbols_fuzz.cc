// ELF symbol tables: LoadBinaryImage on an arbitrary file (.symtab, .dynsym,
// .dynamic/DT_SONAME, notes, program headers, PLT/GOT import calls), then the
// lookups the agent does per sample on the image it returned.
//
// No debug-file search here (no debug roots, no debuginfod, no static
// archives): debuglink_fuzz covers that path.
#include <cstddef>
#include <cstdint>

#include "agent/symbols/binary_image.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

tlsprof::symbols::LoadOptions Options() {
  tlsprof::symbols::LoadOptions o;
  o.debug.debug_roots.clear();
  o.debug.use_debuginfod = false;
  o.debug.static_archive_sonames.clear();
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::symbols;
  static const LoadOptions options = Options();
  const tlsprof::guard::GuardedFile file = tlsprof::fuzz::GuardedMemFile(data, size);
  (void)ReadBuildId(file);
  // A relative display path: no directory to look for debug files in.
  auto image = LoadBinaryImage(file, ImageOrigin{"fuzz.elf", nullptr}, options);
  if (!image) return 0;
  const BinaryImage& img = **image;
  // What the agent does with a sample's address: segment mapping, then the
  // symbol and the import call at it.
  for (const LoadSegment& seg : img.segments) {
    for (uint64_t off : {seg.offset, seg.offset + seg.filesz / 2, seg.offset + seg.filesz}) {
      (void)img.MappingVaddr(off & ~uint64_t{0xfff}, seg.executable);
      if (auto vaddr = img.FileOffsetToVaddr(off)) {
        if (auto i = img.symbols.Find(*vaddr)) (void)img.symbols.at(*i).name.size();
        (void)img.import_calls.CalleeAt(*vaddr);
      }
    }
  }
  for (const Symbol& s : img.symbols.all()) {
    (void)img.symbols.Find(s.addr);
    (void)img.symbols.Find(s.addr + s.size - 1);
  }
  for (const auto& [ret, index] : img.import_calls.sites) (void)img.import_calls.CalleeAt(ret);
  return 0;
}
