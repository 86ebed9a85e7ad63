#include "agent/symbols/binary_image.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "agent/symbols/test_util.h"
#include "common/fd.h"

// Defined here so the test can find itself in its own .symtab.
extern "C" __attribute__((noinline, used)) int TlsprofSymbolsTestMarker(int x) {
  asm volatile("" ::: "memory");
  return x * 3 + 1;
}

namespace tlsprof::symbols {
namespace {

using namespace symtest;

// The names the report and the logs give each source.
TEST(BinaryImageTest, SymbolSourceNames) {
  using enum SymbolSource;
  const std::pair<SymbolSource, std::string_view> kNames[] = {{kNone, "none"},
                                                              {kDynsym, "dynsym"},
                                                              {kSymtab, "symtab"},
                                                              {kGoPclntab, "gopclntab"},
                                                              {kDebugLink, "debuglink"},
                                                              {kBuildIdDebugDir, "build-id-dir"},
                                                              {kDebuginfod, "debuginfod"},
                                                              {kStaticArchive, "static-archive"},
                                                              {kLibraryTables, "library-tables"},
                                                              {kMethodTables, "method-tables"}};
  for (const auto& [source, name] : kNames) EXPECT_EQ(SymbolSourceName(source), name);
}

TEST(BinaryImageTest, FileOffsetToVaddrUsesCoveringLoadSegment) {
  BinaryImage img;
  img.segments.push_back({0x0, 0x0, 0x1000, 0x1000, false});
  img.segments.push_back({0x1000, 0x401000, 0x2000, 0x2000, true});
  img.segments.push_back({0x3000, 0x604000, 0x100, 0x5000, false});  // .bss beyond filesz
  EXPECT_EQ(img.FileOffsetToVaddr(0x10), 0x10u);
  EXPECT_EQ(img.FileOffsetToVaddr(0x1234), 0x401234u);
  EXPECT_EQ(img.FileOffsetToVaddr(0x2fff), 0x402fffu);
  EXPECT_EQ(img.FileOffsetToVaddr(0x30ff), 0x6040ffu);
  EXPECT_FALSE(img.FileOffsetToVaddr(0x3100));  // past filesz: not in the file
}

// lld's layout (BoringSSL's libcrypto.so.0): the R E segment starts in the
// page where the R segment ends, at p_vaddr = p_offset + 0x1000, and the kernel
// maps it from the page-rounded offset 0x86000, which the R segment's file
// range also holds.
TEST(BinaryImageTest, MappingVaddrUsesTheMappingsOwnSegment) {
  BinaryImage img;
  img.segments.push_back({0x0, 0x0, 0x863bc, 0x863bc, false});
  img.segments.push_back({0x863c0, 0x873c0, 0x105e50, 0x105e50, true});
  img.segments.push_back({0x18c210, 0x18e210, 0x113a8, 0x113a8, false});
  EXPECT_EQ(img.FileOffsetToVaddr(0x86000), 0x86000u);  // the R segment's answer
  EXPECT_EQ(img.MappingVaddr(0x86000, /*executable=*/true), 0x87000u);
  EXPECT_EQ(img.MappingVaddr(0x0, /*executable=*/false), 0x0u);
  EXPECT_EQ(img.MappingVaddr(0x18c000, /*executable=*/false), 0x18e000u);
  // A mapping split by mprotect starts inside the segment.
  EXPECT_EQ(img.MappingVaddr(0x100000, /*executable=*/true), 0x101000u);
  // GNU ld's layout (offset == vaddr modulo the page): both agree.
  BinaryImage gnu;
  gnu.segments.push_back({0x0, 0x0, 0x1000, 0x1000, false});
  gnu.segments.push_back({0x1000, 0x401000, 0x2000, 0x2000, true});
  EXPECT_EQ(gnu.MappingVaddr(0x1000, true), gnu.FileOffsetToVaddr(0x1000));
  // No executable segment holds it: FileOffsetToVaddr's answer.
  EXPECT_EQ(gnu.MappingVaddr(0x10, true), 0x10u);
}

TEST(BinaryImageTest, StrippedLibcryptoHasDynsymOnly) {
  LoadOptions no_archives;  // libssl-dev's libcrypto.a would name more (archive_match_test)
  no_archives.debug.static_archive_sonames.clear();
  no_archives.debug.library_tables = false;  // they name more (library_tables_test)
  auto img = LoadPath(kLibcrypto, no_archives);
  ASSERT_TRUE(img) << img.error().message;
  const BinaryImage& i = **img;
  EXPECT_EQ(i.symbol_source, SymbolSource::kDynsym);
  EXPECT_EQ(i.soname, "libcrypto.so.3");
  EXPECT_FALSE(i.is_go);
  EXPECT_EQ(i.build_id, ReadelfBuildId(kLibcrypto));
  EXPECT_EQ(i.build_id.size(), 40u);
  ASSERT_FALSE(i.segments.empty());
  EXPECT_TRUE(std::any_of(i.segments.begin(), i.segments.end(), [](auto& s) { return s.executable; }));
  EXPECT_GT(i.symbols_seen, 3000u);
  EXPECT_EQ(i.symbols_seen, i.symbols.size());  // no filter

  const Symbol* s = SymbolNamed(i, "EVP_EncryptUpdate");
  ASSERT_NE(s, nullptr);
  EXPECT_GT(s->size, 0u);
  auto found = i.symbols.Find(s->addr + s->size / 2);
  ASSERT_TRUE(found);
  EXPECT_EQ(i.symbols.at(*found).name, "EVP_EncryptUpdate");
  EXPECT_FALSE(SymbolNamed(i, "aesni_gcm_encrypt"));  // internal: stripped
}

TEST(BinaryImageTest, KeepFilterAppliesAfterCounting) {
  LoadOptions opts;
  opts.keep = [](std::string_view n) { return n.substr(0, 4) == "EVP_"; };
  auto all = LoadPath(kLibcrypto);
  auto evp = LoadPath(kLibcrypto, opts);
  ASSERT_TRUE(all && evp);
  EXPECT_EQ((*evp)->symbols_seen, (*all)->symbols_seen);
  EXPECT_LT((*evp)->symbols.size(), (*all)->symbols.size());
  EXPECT_GT((*evp)->symbols.size(), 100u);
  for (const Symbol& s : (*evp)->symbols.all()) ASSERT_EQ(s.name.substr(0, 4), "EVP_") << s.name;
}

TEST(BinaryImageTest, ReadBuildIdMatchesReadelf) {
  // This test's own path, not /proc/self/exe: readelf would read itself.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  for (const std::string& path : {std::string(kLibcrypto), self, std::string("/usr/bin/node")}) {
    auto file = guard::OpenHostFile(path);
    if (!file) continue;  // node is optional
    auto id = ReadBuildId(*file);
    ASSERT_TRUE(id) << path << ": " << id.error().message;
    EXPECT_EQ(*id, ReadelfBuildId(path)) << path;
  }
}

// The whole path a sample takes: runtime address -> /proc/self/maps ->
// file offset -> ELF vaddr -> symbol, on this test's own .symtab (PIE).
TEST(BinaryImageTest, OwnExecutableResolvesThroughMaps) {
  auto img = LoadPath("/proc/self/exe");
  ASSERT_TRUE(img) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kSymtab);
  EXPECT_TRUE((*img)->soname.empty());

  const auto ip = reinterpret_cast<uint64_t>(&TlsprofSymbolsTestMarker) + 2;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::optional<uint64_t> file_offset;
  while (std::getline(maps, line)) {
    uint64_t start, end, pgoff;
    char perms[8];
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64, &start, &end, perms, &pgoff) != 4) {
      continue;
    }
    if (ip >= start && ip < end) file_offset = ip - start + pgoff;
  }
  ASSERT_TRUE(file_offset);
  auto vaddr = (*img)->FileOffsetToVaddr(*file_offset);
  ASSERT_TRUE(vaddr);
  auto found = (*img)->symbols.Find(*vaddr);
  ASSERT_TRUE(found);
  EXPECT_EQ((*img)->symbols.at(*found).name, "TlsprofSymbolsTestMarker");
  EXPECT_EQ(TlsprofSymbolsTestMarker(1), 4);  // keep it called
}

// .eh_frame_hdr's table gives each function's start, symbols or not: every
// address inside the marker maps to the marker's own address.
TEST(BinaryImageTest, FunctionStartsComeFromTheEhFrameHeader) {
  auto img = LoadPath("/proc/self/exe");
  ASSERT_TRUE(img) << img.error().message;
  ASSERT_FALSE((*img)->function_starts.empty());
  auto marker = std::find_if((*img)->symbols.all().begin(), (*img)->symbols.all().end(),
                             [](const Symbol& s) { return s.name == "TlsprofSymbolsTestMarker"; });
  ASSERT_NE(marker, (*img)->symbols.all().end());
  ASSERT_GT(marker->size, 2u);
  EXPECT_EQ((*img)->FunctionStartAt(marker->addr), marker->addr);
  EXPECT_EQ((*img)->FunctionStartAt(marker->addr + marker->size - 1), marker->addr);
  EXPECT_NE((*img)->FunctionStartAt(marker->addr - 1), marker->addr);  // the function before it
  EXPECT_FALSE((*img)->FunctionStartAt(0));
}

// A program linked statically against libcrypto.a keeps OpenSSL's internal
// and assembly symbols in .symtab; those are what the profiler needs.
TEST(BinaryImageTest, StaticLibcryptoKeepsInternalSymbols) {
  if (!symtest::HaveTool("cc") || !std::ifstream("/usr/lib/x86_64-linux-gnu/libcrypto.a")) {
    GTEST_SKIP() << "needs cc and libssl-dev's libcrypto.a";
  }
  TempDir dir;
  std::ofstream(dir.File("p.c")) << R"(
#include <openssl/evp.h>
int main(void) {
  unsigned char key[16] = {0}, iv[12] = {0}, out[64]; int n;
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, key, iv);
  EVP_EncryptUpdate(c, out, &n, key, 16);
  EVP_CIPHER_CTX_free(c);
  return n == 16 ? 0 : 1;
})";
  auto r = RunCommand("cc -O1 -o " + dir.File("p") + " " + dir.File("p.c") +
                      " /usr/lib/x86_64-linux-gnu/libcrypto.a -lpthread -ldl");
  ASSERT_EQ(r.status, 0) << r.output;

  auto img = LoadPath(dir.File("p"));
  ASSERT_TRUE(img) << img.error().message;
  const BinaryImage& i = **img;
  EXPECT_EQ(i.symbol_source, SymbolSource::kSymtab);
  EXPECT_EQ(i.build_id, ReadelfBuildId(dir.File("p")));
  for (const char* name :
       {"EVP_EncryptUpdate", "aesni_gcm_encrypt", "aesni_ctr32_encrypt_blocks", "ossl_gcm_stream_update"}) {
    const Symbol* s = SymbolNamed(i, name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_GT(s->size, 0u) << name;
    auto found = i.symbols.Find(s->addr);
    ASSERT_TRUE(found) << name;
  }
}

guard::GuardedFile Open(const std::string& path) {
  auto file = guard::OpenHostFile(path);
  EXPECT_TRUE(file.ok()) << file.error().message;
  return file ? std::move(*file) : guard::GuardedFile();
}

TEST(BinaryImageTest, LoadingReleasesTheFile) {
  // Loading many times must not leak fds or libelf handles; the caller's
  // file stays usable.
  const guard::GuardedFile file = Open(kLibcrypto);
  ASSERT_TRUE(file.valid());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(LoadBinaryImage(file, ImageOrigin{kLibcrypto, nullptr}));
  uint8_t c;
  EXPECT_TRUE(file.ReadExact(0, {&c, 1}).ok());
}

TEST(ImageCacheTest, SharesTheImageOfOneFile) {
  ImageCache cache;
  const guard::GuardedFile a = Open(kLibcrypto), b = Open(kLibcrypto);
  auto ia = cache.Get(a, ImageOrigin{kLibcrypto, nullptr});
  auto ib = cache.Get(b, ImageOrigin{kLibcrypto, nullptr});
  ASSERT_TRUE(ia && ib);
  EXPECT_EQ(ia->get(), ib->get());
  EXPECT_EQ(cache.size(), 1u);

  const guard::GuardedFile self = Open("/proc/self/exe");
  auto is = cache.Get(self, ImageOrigin{"self", nullptr});
  ASSERT_TRUE(is);
  EXPECT_NE(is->get(), ia->get());
  EXPECT_EQ(cache.size(), 2u);
}

// Files are told apart by their identity, and copies shared by their content:
// a build-id is never a key (a file can claim any).
TEST(ImageCacheTest, CopiesShareByContentWithOrWithoutABuildId) {
  ASSERT_TRUE(symtest::HaveTool("objcopy")) << "objcopy (binutils) is needed";
  TempDir dir;
  auto r = RunCommand("objcopy --remove-section .note.gnu.build-id /proc/self/exe " + dir.File("a") + " && cp " +
                      dir.File("a") + " " + dir.File("b") + " && cp " + dir.File("a") + " " + dir.File("c") +
                      " && printf x >> " + dir.File("c"));
  ASSERT_EQ(r.status, 0) << r.output;
  ImageCache cache;
  const guard::GuardedFile a1 = Open(dir.File("a")), a2 = Open(dir.File("a")), b = Open(dir.File("b")),
                           c = Open(dir.File("c"));
  auto i1 = cache.Get(a1, ImageOrigin{"a", nullptr});
  auto i2 = cache.Get(a2, ImageOrigin{"a", nullptr});
  auto i3 = cache.Get(b, ImageOrigin{"b", nullptr});
  auto i4 = cache.Get(c, ImageOrigin{"c", nullptr});
  ASSERT_TRUE(i1 && i2 && i3 && i4) << (i1 ? "" : i1.error().message);
  EXPECT_TRUE((*i1)->build_id.empty());
  EXPECT_EQ(i1->get(), i2->get());  // same file
  EXPECT_EQ(i1->get(), i3->get());  // same bytes, other inode
  EXPECT_NE(i1->get(), i4->get());  // one byte more
  EXPECT_EQ(cache.size(), 3u);      // identities a, b, c
}

TEST(ImageCacheTest, ConcurrentGetsReturnOneImage) {
  ImageCache cache;
  std::vector<const BinaryImage*> seen(8);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] {
      const guard::GuardedFile file = Open(kLibcrypto);
      auto img = cache.Get(file, ImageOrigin{kLibcrypto, nullptr});
      seen[t] = img ? img->get() : nullptr;
    });
  }
  for (auto& th : threads) th.join();
  for (const BinaryImage* p : seen) EXPECT_EQ(p, seen[0]);
  EXPECT_NE(seen[0], nullptr);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ImageCacheTest, PropagatesLoadErrors) {
  TempDir dir;
  symtest::WriteFileBytes(dir.File("junk"), std::vector<uint8_t>(100, 'x'));
  const guard::GuardedFile file = Open(dir.File("junk"));
  ImageCache cache;
  auto img = cache.Get(file, ImageOrigin{"junk", nullptr});
  ASSERT_FALSE(img);
  EXPECT_NE(img.error().message.find("not an ELF"), std::string::npos) << img.error().message;
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace tlsprof::symbols
