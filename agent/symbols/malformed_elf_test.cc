// Malformed ELF files, built by patching copies of real ones: each must give a
// clear Error (or an image without symbols where that is the honest result),
// never a crash or a huge allocation. Run under ASan at least once.
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "agent/symbols/binary_image.h"
#include "agent/symbols/test_util.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

using namespace symtest;

// A copy of an ELF64 file with helpers to patch its headers.
struct ElfBytes {
  std::vector<uint8_t> bytes;

  Elf64_Ehdr* ehdr() { return reinterpret_cast<Elf64_Ehdr*>(bytes.data()); }
  Elf64_Shdr* shdr(size_t i) { return reinterpret_cast<Elf64_Shdr*>(bytes.data() + ehdr()->e_shoff) + i; }
  Elf64_Shdr* Section(const std::string& name) {
    const char* names = reinterpret_cast<const char*>(bytes.data() + shdr(ehdr()->e_shstrndx)->sh_offset);
    for (size_t i = 0; i < ehdr()->e_shnum; ++i) {
      if (name == names + shdr(i)->sh_name) return shdr(i);
    }
    ADD_FAILURE() << "no section " << name;
    return shdr(0);
  }
};

class MalformedElfTest : public ::testing::Test {
 protected:
  static ElfBytes Copy(const std::string& path) { return ElfBytes{ReadFileBytes(path)}; }

  // Writes `bytes` to a temp file and loads it.
  Result<std::shared_ptr<const BinaryImage>> Load(const std::vector<uint8_t>& bytes) {
    std::string path = dir_.File("f" + std::to_string(counter_++));
    WriteFileBytes(path, bytes);
    auto file = guard::OpenHostFile(path);
    if (!file) return file.error();
    auto img = LoadBinaryImage(*file, ImageOrigin{path, nullptr});
    std::filesystem::remove(path);
    return img;
  }

  // Expects an Error whose message contains `what`.
  void ExpectError(const std::vector<uint8_t>& bytes, const std::string& what) {
    auto img = Load(bytes);
    ASSERT_FALSE(img) << "expected an error mentioning '" << what << "'";
    EXPECT_NE(img.error().message.find(what), std::string::npos) << img.error().message;
  }

  TempDir dir_;
  int counter_ = 0;
};

TEST_F(MalformedElfTest, EmptyFile) { ExpectError({}, "empty file"); }

TEST_F(MalformedElfTest, NonElfFile) {
  std::string text = "#!/bin/sh\necho this is a script, not an ELF binary\n";
  ExpectError(std::vector<uint8_t>(text.begin(), text.end()), "not an ELF file");
  // Right magic, nothing after it.
  ExpectError({0x7f, 'E', 'L', 'F'}, "not an ELF");
}

TEST_F(MalformedElfTest, TruncatedAtManyLengths) {
  ElfBytes base = Copy(kLibcrypto);
  const size_t size = base.bytes.size();
  const size_t shoff = base.ehdr()->e_shoff;
  for (size_t cut : {size_t{1}, size_t{16}, size_t{63}, size_t{64}, size_t{65}, size_t{200}, size_t{4096},
                     size_t{65536}, size / 3, size / 2, shoff, shoff + 100, size - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    std::vector<uint8_t> bytes(base.bytes.begin(), base.bytes.begin() + static_cast<ptrdiff_t>(cut));
    auto img = Load(bytes);
    // Section headers sit at the end of the file, so every cut loses them or
    // the sections they describe: all of these are errors.
    ASSERT_FALSE(img);
    EXPECT_FALSE(img.error().message.empty());
  }
}

TEST_F(MalformedElfTest, SectionHeaderOffsetBeyondEof) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_shoff = e.bytes.size() + 4096;
  ExpectError(e.bytes, "section");
}

TEST_F(MalformedElfTest, HugeSectionCount) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_shnum = 0xfeff;  // below SHN_LORESERVE, far past the file
  ExpectError(e.bytes, "section");
}

TEST_F(MalformedElfTest, HugeProgramHeaderCount) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_phnum = 0xfffe;
  ExpectError(e.bytes, "program header");
}

TEST_F(MalformedElfTest, WrongHeaderEntrySize) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_shentsize = 8;
  ExpectError(e.bytes, "section header entries are 8 bytes");
}

TEST_F(MalformedElfTest, ProgramHeaderOffsetBeyondEof) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_phoff = e.bytes.size() - 8;
  ExpectError(e.bytes, "program header");
}

TEST_F(MalformedElfTest, SymbolTableBeyondEof) {
  ElfBytes e = Copy(kLibcrypto);
  e.Section(".dynsym")->sh_offset = e.bytes.size() - 16;
  ExpectError(e.bytes, ".dynsym");
}

TEST_F(MalformedElfTest, HugeSymbolTableSize) {
  ElfBytes e = Copy(kLibcrypto);
  e.Section(".dynsym")->sh_size = 24ull << 36;  // a "count" of 2^36 symbols
  ExpectError(e.bytes, "past the end of the file");
}

TEST_F(MalformedElfTest, SymbolTableEntsizeZero) {
  ElfBytes e = Copy(kLibcrypto);
  e.Section(".dynsym")->sh_entsize = 0;
  ExpectError(e.bytes, "entry size 0");
}

TEST_F(MalformedElfTest, SymbolTableSizeNotMultipleOfEntsize) {
  ElfBytes e = Copy(kLibcrypto);
  e.Section(".dynsym")->sh_size -= 5;
  ExpectError(e.bytes, "not a multiple");
}

TEST_F(MalformedElfTest, SymbolTableLinksToNonStringTable) {
  ElfBytes e = Copy(kLibcrypto);
  Elf64_Shdr* dynsym = e.Section(".dynsym");
  dynsym->sh_link = static_cast<uint32_t>(dynsym - e.shdr(0));  // itself
  ExpectError(e.bytes, "not a string table");
  dynsym->sh_link = 0xffff;
  ExpectError(e.bytes, "not a string table");
}

TEST_F(MalformedElfTest, NameOffsetsOutOfRange) {
  ElfBytes e = Copy(std::filesystem::read_symlink("/proc/self/exe"));
  e.Section(".strtab")->sh_size = 16;  // most names now point past its end
  ExpectError(e.bytes, "name offset");
  // In a library the soname is checked first; either way, an Error.
  e = Copy(kLibcrypto);
  e.Section(".dynstr")->sh_size = 16;
  ExpectError(e.bytes, "string table");
}

TEST_F(MalformedElfTest, UnterminatedStringTable) {
  ElfBytes e = Copy(kLibcrypto);
  Elf64_Shdr* dynstr = e.Section(".dynstr");
  e.bytes[dynstr->sh_offset + dynstr->sh_size - 1] = 'x';  // last name loses its NUL
  auto img = Load(e.bytes);
  // Only the names at the very end are affected; which symbol owns them
  // decides between an error and a (correct) image. Either way: no overread.
  if (!img) {
    EXPECT_NE(img.error().message.find("unterminated"), std::string::npos) << img.error().message;
  }
}

TEST_F(MalformedElfTest, SymtabCorruptionInExecutable) {
  ElfBytes e = Copy(std::filesystem::read_symlink("/proc/self/exe"));
  e.Section(".symtab")->sh_entsize = 1000;
  ExpectError(e.bytes, ".symtab has entry size 1000");
  e = Copy(std::filesystem::read_symlink("/proc/self/exe"));
  e.Section(".strtab")->sh_offset = e.bytes.size() + 1;
  ExpectError(e.bytes, ".strtab");
}

TEST_F(MalformedElfTest, BogusSectionNameTableIndex) {
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_shstrndx = 0xfeff;
  auto img = Load(e.bytes);
  // libelf accepts the index; names then fail to resolve, which only loses
  // name-based facts (Go sections). Symbols come from section types.
  if (img) {
    EXPECT_EQ((*img)->symbol_source, SymbolSource::kDynsym);
  }
}

TEST_F(MalformedElfTest, NoSectionHeadersAtAll) {
  // Like sstrip output: program headers and notes stay, symbols are gone.
  ElfBytes e = Copy(kLibcrypto);
  e.ehdr()->e_shoff = 0;
  e.ehdr()->e_shnum = 0;
  e.ehdr()->e_shstrndx = 0;
  auto img = Load(e.bytes);
  ASSERT_TRUE(img) << img.error().message;
  EXPECT_EQ((*img)->symbol_source, SymbolSource::kNone);
  EXPECT_TRUE((*img)->symbols.empty());
  EXPECT_FALSE((*img)->segments.empty());
  EXPECT_EQ((*img)->build_id.size(), 40u);  // from PT_NOTE
}

TEST_F(MalformedElfTest, WrongClassByte) {
  ElfBytes e = Copy(kLibcrypto);
  e.bytes[EI_CLASS] = 7;
  ExpectError(e.bytes, "");
}

// Random byte corruption of a small binary: any outcome but a crash is fine.
TEST_F(MalformedElfTest, RandomCorruptionNeverCrashes) {
  std::string small = std::filesystem::exists("/usr/bin/true") ? "/usr/bin/true" : kLibcrypto;
  const std::vector<uint8_t> base = ReadFileBytes(small);
  ElfBytes headers{base};
  const size_t shoff = headers.ehdr()->e_shoff;
  std::mt19937 rng(1234);
  int errors = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<uint8_t> bytes = base;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      // Favour the headers, where corruption changes what the parser does.
      size_t pos;
      switch (rng() % 3) {
        case 0:
          pos = rng() % 64;
          break;  // ELF header
        case 1:
          pos = shoff + rng() % (bytes.size() - shoff);
          break;  // section headers
        default:
          pos = rng() % bytes.size();
          break;  // anywhere
      }
      bytes[pos] = static_cast<uint8_t>(rng());
    }
    auto img = Load(bytes);
    if (!img) {
      ++errors;
      EXPECT_FALSE(img.error().message.empty());
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace tlsprof::symbols
