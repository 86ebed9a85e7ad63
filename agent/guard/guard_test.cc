// The guarded opener and the ELF opener against the files a hostile tenant
// makes: symlinks out of its root, FIFOs, replaced and truncated files,
// sparse giants, headers that claim more than the file holds.
#include "agent/guard/guarded_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "agent/guard/elf_file.h"
#include "agent/guard/limits.h"

namespace tlsprof::guard {
namespace {

namespace fs = std::filesystem;

uint64_t Refused(Reason reason) { return RefusalCounts()[static_cast<size_t>(reason)]; }

// A fresh directory under the test's temp dir, removed at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& under = "/tmp") {
    std::string tmpl = under + "/guard_test.XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(std::string_view rel) const { return path_ + "/" + std::string(rel); }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
}

std::string LibcryptoPath() {
  for (const char* p : {"/usr/lib/x86_64-linux-gnu/libcrypto.so.3", "/lib/x86_64-linux-gnu/libcrypto.so.3"}) {
    if (access(p, R_OK) == 0) return p;
  }
  return "";
}

// Fails the test (instead of hanging it) if `fn` does not return within `limit`.
template <typename Fn>
void WithinSeconds(int limit, Fn fn) {
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < limit * 10 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!done) {
      std::fprintf(stderr, "blocked for %d s: the opener waited on something it must not\n", limit);
      std::abort();
    }
  });
  fn();
  done = true;
  watchdog.join();
}

TEST(ProcessRoot, AbsoluteSymlinksResolveInsideTheRoot) {
  TempDir host;
  WriteFile(host / "canary", "host secret");
  TempDir root;
  fs::create_directories(root / "usr/lib");
  WriteFile(root / "usr/lib/libfoo.so", "inside");
  fs::create_symlink(host / "canary", root / "usr/lib/evil.debug");     // absolute, pointing at the host
  fs::create_symlink("/usr/lib/libfoo.so", root / "usr/lib/alias.so");  // absolute, inside
  fs::create_symlink("../../../../../../" + host.path() + "/canary", root / "usr/lib/dots.debug");
  auto r = ProcessRoot::OpenDirectory(root.path());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->OpenFile("/usr/lib/evil.debug").ok());  // resolves to <root>/<host>/canary: absent
  EXPECT_FALSE(r->OpenFile("/usr/lib/dots.debug").ok());  // ".." stops at the root
  EXPECT_FALSE(r->OpenFile("/../" + host.path() + "/canary").ok());
  auto alias = r->OpenFile("/usr/lib/alias.so");
  ASSERT_TRUE(alias.ok()) << alias.error().message;
  std::vector<uint8_t> bytes(6);
  ASSERT_TRUE(alias->ReadExact(0, bytes).ok());
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "inside");
}

TEST(ProcessRoot, PathsOfAChrootAreTakenRelativeToItsRoot) {
  TempDir root;
  auto r = ProcessRoot::OpenDirectory(root.path() + "/");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->host_prefix(), root.path());
  EXPECT_EQ(r->InsidePath(root.path() + "/usr/lib/x.so"), "/usr/lib/x.so");
  EXPECT_EQ(r->InsidePath("/usr/lib/x.so"), std::nullopt);
  EXPECT_EQ(r->InsidePath(root.path() + "x/usr/lib/x.so"), std::nullopt);  // a sibling with a longer name
  auto self = ProcessRoot::Open(getpid());
  ASSERT_TRUE(self.ok()) << self.error().message;
  EXPECT_EQ(self->host_prefix(), "");
  EXPECT_EQ(self->InsidePath("/usr/lib/x.so"), "/usr/lib/x.so");
}

TEST(GuardedOpen, AFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir root;
  ASSERT_EQ(mkfifo((root / "libcrypto.so.3").c_str(), 0644), 0);
  auto r = ProcessRoot::OpenDirectory(root.path());
  ASSERT_TRUE(r.ok());
  const uint64_t before = Refused(Reason::kNotRegular);
  WithinSeconds(10, [&] {
    auto f = r->OpenFile("/libcrypto.so.3");
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.error().message.find("FIFO"), std::string::npos) << f.error().message;
    auto host = OpenHostFile(root / "libcrypto.so.3");
    EXPECT_FALSE(host.ok());
  });
  EXPECT_EQ(Refused(Reason::kNotRegular), before + 2);
  // A directory and a device are no better.
  EXPECT_FALSE(r->OpenFile("/").ok());
  EXPECT_FALSE(OpenHostFile("/dev/null").ok());
}

TEST(GuardedOpen, AMappingIsOpenedOnlyIfItIsStillTheMappedFile) {
  TempDir dir;
  const std::string lib = dir / "libmapped.so";
  WriteFile(lib, std::string(8192, 'a'));
  const int fd = ::open(lib.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, 8192, PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  ::close(fd);
  MappedFileRef ref;
  ref.pid = getpid();
  ref.start = reinterpret_cast<uint64_t>(map);
  ref.end = ref.start + 8192;
  ref.id = {st.st_dev, st.st_ino};
  ref.path = lib;
  // map_files (when allowed) or the path: both reach the mapped file.
  auto opened = OpenMapping(ref);
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened->id(), ref.id);
  EXPECT_EQ(opened->size(), 8192u);

  // The path now names another file: the mapping's own range still reaches
  // the mapped inode through map_files, but a range that no longer exists
  // falls back to the path, which must be refused.
  WriteFile(dir / "other", "b");
  fs::rename(dir / "other", lib);
  MappedFileRef gone = ref;
  gone.start += 0x1000000000;
  gone.end += 0x1000000000;
  const uint64_t before = Refused(Reason::kReplaced);
  auto replaced = OpenMapping(gone);
  ASSERT_FALSE(replaced.ok());
  EXPECT_NE(replaced.error().message.find("another file"), std::string::npos) << replaced.error().message;
  EXPECT_EQ(Refused(Reason::kReplaced), before + 1);
  // A deleted mapping that is gone is not looked up by path at all.
  gone.deleted = true;
  EXPECT_FALSE(OpenMapping(gone).ok());
  EXPECT_EQ(Refused(Reason::kReplaced), before + 1);
  // map_files alone: the mapped inode, whatever the path names now; a range
  // no longer mapped is an error, never a look-up of the path.
  auto inode = OpenMappedInode(ref);
  ASSERT_TRUE(inode.ok()) << inode.error().message;
  EXPECT_EQ(inode->id(), ref.id);
  gone.deleted = false;
  EXPECT_FALSE(OpenMappedInode(gone).ok());
  EXPECT_EQ(Refused(Reason::kReplaced), before + 1);
  munmap(map, 8192);
}

TEST(GuardedOpen, ASparseGiantIsRefusedAtOpen) {
  TempDir dir;
  const std::string path = dir / "libcrypto.so.3";
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64ll << 30), 0);
  ::close(fd);
  const uint64_t before = Refused(Reason::kFileSize);
  auto f = OpenHostFile(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(Refused(Reason::kFileSize), before + 1);
}

TEST(GuardedFile, ReadsAreBoundedAndAShrunkFileIsAShortRead) {
  TempDir dir;
  const std::string path = dir / "data";
  WriteFile(path, std::string(4096, 'x'));
  auto f = OpenHostFile(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const uint64_t refused = Refused(Reason::kSectionSize);
  EXPECT_FALSE(f->ReadRange(0, 4096, 1024, "range").ok());
  EXPECT_EQ(Refused(Reason::kSectionSize), refused + 1);
  EXPECT_FALSE(f->ReadRange(4000, 200, 1 << 20, "range").ok());  // past the end
  auto ok = f->ReadRange(4000, 96, 1 << 20, "range");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 96u);
  EXPECT_FALSE(f->ChangedSinceOpen());
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  EXPECT_TRUE(f->ChangedSinceOpen());
  const uint64_t short_reads = Refused(Reason::kShortRead);
  EXPECT_FALSE(f->ReadRange(0, 1000, 1 << 20, "range").ok());
  EXPECT_EQ(Refused(Reason::kShortRead), short_reads + 1);
}

// Files whose reads no tenant's daemon answers (a disk's filesystem) are
// told from those that may wait on one: tmpfs, overlay and FUSE have an
// anonymous device (major 0), as a tenant's own mount would.
TEST(GuardedFile, SaysWhetherItIsOnABlockDevice) {
  EXPECT_TRUE(GuardedFile::OnBlockDevice(makedev(254, 0)));
  EXPECT_FALSE(GuardedFile::OnBlockDevice(makedev(0, 52)));
  struct stat st {};
  ASSERT_EQ(stat("/dev/shm", &st), 0);
  ASSERT_EQ(major(st.st_dev), 0u) << "/dev/shm is expected on tmpfs";
  TempDir shm("/dev/shm");
  WriteFile(shm / "data", "x");
  auto in_memory = OpenHostFile(shm / "data");
  ASSERT_TRUE(in_memory.ok()) << in_memory.error().message;
  EXPECT_FALSE(in_memory->on_block_device());
  auto self = OpenHostFile("/proc/self/exe");
  ASSERT_TRUE(self.ok()) << self.error().message;
  ASSERT_EQ(stat("/proc/self/exe", &st), 0);
  EXPECT_EQ(self->on_block_device(), major(st.st_dev) != 0);
}

TEST(ProcLines, AreCutAtTheirByteCap) {
  std::vector<std::string> lines;
  auto cut = ForEachProcLine("/proc/self/maps", 1 << 20, [&](std::string_view l) {
    lines.emplace_back(l);
    return true;
  });
  ASSERT_TRUE(cut.ok());
  EXPECT_FALSE(*cut);
  ASSERT_GT(lines.size(), 5u);
  // Only whole lines within the first 100 bytes come (under ASan the first
  // lines of maps are short: its shadow ranges have no path).
  size_t n = 0, bytes = 0;
  auto small = ForEachProcLine("/proc/self/maps", 100, [&](std::string_view l) {
    ++n;
    bytes += l.size() + 1;
    return true;
  });
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(*small);
  EXPECT_LE(bytes, 100u);
  EXPECT_LT(n, lines.size());
  auto text = ReadProcText("/proc/self/maps", 64);
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(text->truncated);
  EXPECT_EQ(text->text.size(), 64u);
}

// An ELF64 x86-64 header with the given section header count, table at the
// end of a file of `size` bytes (sparse).
std::string ElfHeader(uint16_t shnum, uint64_t shoff) {
  Elf64_Ehdr e{};
  std::memcpy(e.e_ident, ELFMAG, SELFMAG);
  e.e_ident[EI_CLASS] = ELFCLASS64;
  e.e_ident[EI_DATA] = ELFDATA2LSB;
  e.e_ident[EI_VERSION] = EV_CURRENT;
  e.e_type = ET_DYN;
  e.e_machine = EM_X86_64;
  e.e_version = EV_CURRENT;
  e.e_ehsize = sizeof e;
  e.e_shoff = shoff;
  e.e_shentsize = sizeof(Elf64_Shdr);
  e.e_shnum = shnum;
  return std::string(reinterpret_cast<const char*>(&e), sizeof e);
}

TEST(ElfFile, HeaderTablesOverTheCapsAreRefusedBeforeLibelfSizesThem) {
  TempDir dir;
  const std::string path = dir / "many-sections.so";
  const uint64_t size = 8ull << 30;  // sparse: room for 60,000 section headers anywhere
  WriteFile(path, ElfHeader(60000, size - 60000 * sizeof(Elf64_Shdr)));
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(size - 1)), 0);
  auto file = OpenHostFile(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  const uint64_t before = Refused(Reason::kElfHeaders);
  auto elf = ElfFile::Open(*file);
  ASSERT_FALSE(elf.ok());
  EXPECT_EQ(Refused(Reason::kElfHeaders), before + 1);
}

TEST(ElfFile, ACompressedSectionIsNotInflatedPastItsCap) {
  // A header, one SHF_COMPRESSED section whose Chdr claims 64 GiB, .shstrtab.
  const std::string names = std::string("\0.debug_frame\0.shstrtab\0", 24);
  Elf64_Chdr chdr{};
  chdr.ch_type = ELFCOMPRESS_ZLIB;
  chdr.ch_size = 64ull << 30;
  chdr.ch_addralign = 8;
  std::string body(reinterpret_cast<const char*>(&chdr), sizeof chdr);
  body += std::string(64, '\x78');
  const uint64_t body_off = sizeof(Elf64_Ehdr), names_off = body_off + body.size();
  const uint64_t shoff = (names_off + names.size() + 7) & ~uint64_t{7};
  Elf64_Shdr sh[3]{};
  sh[1].sh_name = 1;
  sh[1].sh_type = SHT_PROGBITS;
  sh[1].sh_flags = SHF_COMPRESSED;
  sh[1].sh_offset = body_off;
  sh[1].sh_size = body.size();
  sh[1].sh_addralign = 8;
  sh[2].sh_name = 14;
  sh[2].sh_type = SHT_STRTAB;
  sh[2].sh_offset = names_off;
  sh[2].sh_size = names.size();
  std::string image = ElfHeader(3, shoff);
  reinterpret_cast<Elf64_Ehdr*>(image.data())->e_shstrndx = 2;
  image += body + names;
  image.resize(shoff);
  image += std::string(reinterpret_cast<const char*>(sh), sizeof sh);
  auto elf = ElfFile::OpenMemory(std::vector<uint8_t>(image.begin(), image.end()), "compressed");
  ASSERT_TRUE(elf.ok()) << elf.error().message;
  const ElfSection* frame = elf->Find(".debug_frame");
  ASSERT_NE(frame, nullptr);
  const uint64_t before = Refused(Reason::kSectionSize);
  auto bytes = elf->SectionBytes(*frame);
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.error().message.find("inflates"), std::string::npos) << bytes.error().message;
  EXPECT_EQ(Refused(Reason::kSectionSize), before + 1);
}

// A sparse file of `count` PROGBITS sections of `each` bytes named ".s",
// and a section name table of `names_size` bytes (its first bytes "\0.s\0",
// zeros past them; sparse too): sections at 1 MiB, names after them, the
// headers at the end.
std::string SparseSections(const TempDir& dir, int count, uint64_t each, uint64_t names_size) {
  const std::string path = dir / "sections.so";
  const uint64_t data_off = 1ull << 20;
  const uint64_t names_off = data_off + count * each;
  const uint64_t shoff = names_off + names_size;
  std::vector<Elf64_Shdr> sh(count + 2);
  for (int i = 1; i <= count; ++i) {
    sh[i].sh_name = 1;
    sh[i].sh_type = SHT_PROGBITS;
    sh[i].sh_offset = data_off + (i - 1) * each;
    sh[i].sh_size = each;
  }
  sh[count + 1].sh_type = SHT_STRTAB;
  sh[count + 1].sh_offset = names_off;
  sh[count + 1].sh_size = names_size;
  std::string head = ElfHeader(static_cast<uint16_t>(count + 2), shoff);
  reinterpret_cast<Elf64_Ehdr*>(head.data())->e_shstrndx = static_cast<uint16_t>(count + 1);
  WriteFile(path, head);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(names_off));
  f.write("\0.s\0", 4);
  f.seekp(static_cast<std::streamoff>(shoff));
  f.write(reinterpret_cast<const char*>(sh.data()), static_cast<std::streamsize>(sh.size() * sizeof(Elf64_Shdr)));
  return path;
}

// Every section under kMaxSectionBytes, but together over what one image may
// keep read (eh_frame_large_fuzz's finding: each of many .gopclntab sections
// was read, 128 MiB at a time): the one past kMaxImageSectionBytes is refused.
TEST(ElfFile, SectionsReadOfOneImageStopAtItsCap) {
  TempDir dir;
  const uint64_t each = 120ull << 20;
  const int fit = static_cast<int>(kMaxImageSectionBytes / each);
  auto file = OpenHostFile(SparseSections(dir, fit + 1, each, 4));
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto elf = ElfFile::Open(*file);
  ASSERT_TRUE(elf.ok()) << elf.error().message;
  EXPECT_TRUE(elf->names_read());
  const uint64_t before = Refused(Reason::kSectionSize);
  for (int i = 1; i <= fit; ++i) {
    auto bytes = elf->SectionBytes(elf->sections()[i]);
    ASSERT_TRUE(bytes.ok()) << i << ": " << bytes.error().message;
    EXPECT_EQ(elf->sections()[i].name, ".s");
  }
  auto past = elf->SectionBytes(elf->sections()[fit + 1]);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message.find("of one image"), std::string::npos) << past.error().message;
  EXPECT_EQ(Refused(Reason::kSectionSize), before + 1);
}

// A section name table over kMaxSectionBytes is left unread at Open(), and
// names_read() says so: libdw would read it whole (go_plan_large_fuzz's
// finding, a 2.4 GB malloc in dwarf_begin_elf).
TEST(ElfFile, ANameTableOverTheCapIsLeftUnreadAndSaidSo) {
  TempDir dir;
  auto file = OpenHostFile(SparseSections(dir, 1, 16, kMaxSectionBytes + 1));
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto elf = ElfFile::Open(*file);
  ASSERT_TRUE(elf.ok()) << elf.error().message;
  EXPECT_EQ(elf->sections()[1].name, "");
  EXPECT_FALSE(elf->names_read());
}

TEST(ElfFile, ReadsARealLibraryLikeReadelf) {
  const std::string lib = LibcryptoPath();
  ASSERT_FALSE(lib.empty()) << "libcrypto.so.3 (libssl3) is needed";
  auto file = OpenHostFile(lib);
  ASSERT_TRUE(file.ok());
  auto elf = ElfFile::Open(*file);
  ASSERT_TRUE(elf.ok()) << elf.error().message;
  EXPECT_TRUE(elf->x86_64());
  const ElfSection* dynsym = elf->FindType(SHT_DYNSYM);
  ASSERT_NE(dynsym, nullptr);
  EXPECT_EQ(dynsym->name, ".dynsym");
  auto syms = elf->SectionBytes(*dynsym);
  ASSERT_TRUE(syms.ok());
  EXPECT_EQ(syms->size(), dynsym->shdr.sh_size);
  ASSERT_NE(elf->data(*dynsym), nullptr);
  // Some exported name through the linked string table.
  bool found = false;
  for (size_t i = 1; i < syms->size() / sizeof(Elf64_Sym) && !found; ++i) {
    GElf_Sym sym;
    ASSERT_NE(gelf_getsym(elf->data(*dynsym), static_cast<int>(i), &sym), nullptr);
    found = elf->StringAt(dynsym->shdr.sh_link, sym.st_name) == "EVP_EncryptUpdate";
  }
  EXPECT_TRUE(found);
  const ElfSection* text = elf->Find(".text");
  ASSERT_NE(text, nullptr);
  auto code = elf->ReadVaddr(text->shdr.sh_addr, 16, /*code=*/true);
  ASSERT_TRUE(code.ok()) << code.error().message;
  auto direct = elf->Read(text->shdr.sh_offset, 16, 16, "text");
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(*code, *direct);
}

// A tenant truncates and restores its library in a loop while the agent
// reads it: every read either succeeds or fails cleanly (no SIGBUS: nothing
// is mapped).
TEST(ElfFile, SurvivesALibraryTruncatedWhileItIsRead) {
  const std::string lib = LibcryptoPath();
  ASSERT_FALSE(lib.empty());
  TempDir dir;
  const std::string copy = dir / "libcrypto.so.3";
  fs::copy_file(lib, copy);
  std::ifstream in(lib, std::ios::binary);
  const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::atomic<bool> stop{false};
  std::thread tenant([&] {
    while (!stop) {
      ASSERT_EQ(truncate(copy.c_str(), 0), 0);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      WriteFile(copy, original);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  int opened = 0, failed = 0;
  for (int i = 0; i < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // reads fall at every phase of the tenant's loop
    auto file = OpenHostFile(copy);
    if (!file) {
      ++failed;
      continue;
    }
    auto elf = ElfFile::Open(*file);
    if (!elf) {
      ++failed;
      continue;
    }
    for (const ElfSection& s : elf->sections()) (void)elf->SectionBytes(s);
    ++opened;
  }
  stop = true;
  tenant.join();
  EXPECT_EQ(opened + failed, 300);
  EXPECT_GT(opened, 0);
  EXPECT_GT(failed, 0);
  std::printf("opened %d, failed cleanly %d of 300 while truncated in a loop\n", opened, failed);
}

}  // namespace
}  // namespace tlsprof::guard
