#include "crafted_elf.h"

#include <dwarf.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/fd.h"

namespace tlsprof::hostile {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kGiB = 1ull << 30;

[[noreturn]] void Fail(const std::string& what) { throw std::runtime_error(what); }
[[noreturn]] void FailErrno(const std::string& what) { Fail(what + ": " + std::strerror(errno)); }

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

UniqueFd Create(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) FailErrno("cannot create " + path);
  return fd;
}

void WriteAt(int fd, uint64_t off, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    const ssize_t n = pwrite(fd, p, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      FailErrno("write");
    }
    p += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<size_t>(n);
  }
}

void WriteAt(int fd, uint64_t off, const std::vector<uint8_t>& bytes) { WriteAt(fd, off, bytes.data(), bytes.size()); }

void Resize(int fd, uint64_t size) {
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) FailErrno("ftruncate");
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) FailErrno("cannot open " + path);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) FailErrno("fstat " + path);
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = pread(fd.get(), out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) FailErrno("read " + path);
    got += static_cast<size_t>(n);
  }
  return out;
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  UniqueFd fd = Create(path);
  WriteAt(fd.get(), 0, bytes);
}

// Little-endian appends to a byte vector.
struct Bytes {
  std::vector<uint8_t> b;
  void U8(uint8_t v) { b.push_back(v); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Uleb(uint64_t v) {
    do {
      uint8_t byte = v & 0x7f;
      v >>= 7;
      if (v != 0) byte |= 0x80;
      b.push_back(byte);
    } while (v != 0);
  }
  void Str(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    b.push_back(0);
  }
  void PutU32(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  void PadTo(size_t multiple, uint8_t fill = 0) {
    while (b.size() % multiple != 0) b.push_back(fill);
  }
};

struct Section {
  std::string name;
  Elf64_Word type = SHT_PROGBITS;
  Elf64_Xword flags = 0;
  Elf64_Addr addr = 0;
  Elf64_Off offset = 0;
  Elf64_Xword size = 0;
  Elf64_Word link = 0;  // an index into `sections` counted from 1 (0 is the null section)
  Elf64_Word info = 0;
  Elf64_Xword align = 1;
  Elf64_Xword entsize = 0;
};

Elf64_Phdr Segment(Elf64_Word type, Elf64_Word flags, uint64_t offset, uint64_t vaddr, uint64_t size) {
  Elf64_Phdr p{};
  p.p_type = type;
  p.p_flags = flags;
  p.p_offset = offset;
  p.p_vaddr = p.p_paddr = vaddr;
  p.p_filesz = p.p_memsz = size;
  p.p_align = type == PT_LOAD ? kPage : 8;
  return p;
}

// Writes the ELF header at 0, `phdrs` right after it, a .shstrtab (appended
// to `sections`, after the null section that leads them) at `end`, and the
// section header table after it. Everything else must lie below `end` or in
// holes; the headers must fit below the first section (0x1000 in every file
// here). Returns the offset just past the section headers.
uint64_t WriteHeaders(int fd, const std::vector<Elf64_Phdr>& phdrs, std::vector<Section> sections, uint64_t end) {
  if (64 + phdrs.size() * sizeof(Elf64_Phdr) > 0x1000) Fail("too many program headers");
  sections.push_back({.name = ".shstrtab", .type = SHT_STRTAB});
  Bytes names;
  names.U8(0);
  std::vector<Elf64_Shdr> shdrs(1);
  for (const Section& s : sections) {
    Elf64_Shdr h{};
    h.sh_name = static_cast<Elf64_Word>(names.b.size());
    names.Str(s.name);
    h.sh_type = s.type;
    h.sh_flags = s.flags;
    h.sh_addr = s.addr;
    h.sh_offset = s.offset;
    h.sh_size = s.size;
    h.sh_link = s.link;
    h.sh_info = s.info;
    h.sh_addralign = s.align;
    h.sh_entsize = s.entsize;
    shdrs.push_back(h);
  }
  shdrs.back().sh_offset = end;
  shdrs.back().sh_size = names.b.size();
  WriteAt(fd, end, names.b);
  const uint64_t shoff = AlignUp(end + names.b.size(), 8);
  WriteAt(fd, shoff, shdrs.data(), shdrs.size() * sizeof(Elf64_Shdr));

  Elf64_Ehdr e{};
  std::memcpy(e.e_ident, ELFMAG, SELFMAG);
  e.e_ident[EI_CLASS] = ELFCLASS64;
  e.e_ident[EI_DATA] = ELFDATA2LSB;
  e.e_ident[EI_VERSION] = EV_CURRENT;
  e.e_ident[EI_OSABI] = ELFOSABI_SYSV;
  e.e_type = ET_DYN;
  e.e_machine = EM_X86_64;
  e.e_version = EV_CURRENT;
  e.e_phoff = phdrs.empty() ? 0 : sizeof(Elf64_Ehdr);
  e.e_shoff = shoff;
  e.e_ehsize = sizeof(Elf64_Ehdr);
  e.e_phentsize = sizeof(Elf64_Phdr);
  e.e_phnum = static_cast<Elf64_Half>(phdrs.size());
  e.e_shentsize = sizeof(Elf64_Shdr);
  e.e_shnum = static_cast<Elf64_Half>(shdrs.size());
  e.e_shstrndx = static_cast<Elf64_Half>(shdrs.size() - 1);
  WriteAt(fd, 0, &e, sizeof e);
  if (!phdrs.empty()) WriteAt(fd, sizeof e, phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr));
  return shoff + shdrs.size() * sizeof(Elf64_Shdr);
}

// The parsed headers of an ELF64 little-endian file held in memory.
struct Parsed {
  Elf64_Ehdr ehdr{};
  std::vector<Elf64_Shdr> shdrs;
};

Parsed Parse(const std::vector<uint8_t>& f, const std::string& path) {
  Parsed p;
  if (f.size() < sizeof(Elf64_Ehdr) || std::memcmp(f.data(), ELFMAG, SELFMAG) != 0 || f[EI_CLASS] != ELFCLASS64 ||
      f[EI_DATA] != ELFDATA2LSB) {
    Fail(path + " is not a little-endian ELF64 file");
  }
  std::memcpy(&p.ehdr, f.data(), sizeof p.ehdr);
  const uint64_t shoff = p.ehdr.e_shoff, shnum = p.ehdr.e_shnum;
  if (p.ehdr.e_shentsize != sizeof(Elf64_Shdr) || shoff > f.size() || (f.size() - shoff) / sizeof(Elf64_Shdr) < shnum) {
    Fail(path + ": section headers out of range");
  }
  p.shdrs.resize(shnum);
  std::memcpy(p.shdrs.data(), f.data() + shoff, shnum * sizeof(Elf64_Shdr));
  for (const Elf64_Shdr& s : p.shdrs) {
    if (s.sh_type != SHT_NOBITS && (s.sh_offset > f.size() || f.size() - s.sh_offset < s.sh_size)) {
      Fail(path + ": a section lies outside the file");
    }
  }
  return p;
}

std::vector<uint8_t> ParseHex(const std::string& hex) {
  if (hex.size() % 2 != 0) Fail("build-id '" + hex + "' has an odd number of hex digits");
  std::vector<uint8_t> out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + i, "%2x", &v) != 1) Fail("build-id '" + hex + "' is not hex");
    out.push_back(static_cast<uint8_t>(v));
  }
  return out;
}

// Replaces the descriptor of the GNU build-id note in `f`.
void PatchBuildId(std::vector<uint8_t>& f, const Parsed& p, const std::string& hex, const std::string& path) {
  const std::vector<uint8_t> id = ParseHex(hex);
  for (const Elf64_Shdr& s : p.shdrs) {
    if (s.sh_type != SHT_NOTE) continue;
    for (uint64_t off = s.sh_offset; off + 12 <= s.sh_offset + s.sh_size;) {
      uint32_t namesz, descsz, type;
      std::memcpy(&namesz, &f[off], 4);
      std::memcpy(&descsz, &f[off + 4], 4);
      std::memcpy(&type, &f[off + 8], 4);
      const uint64_t name = off + 12, desc = name + AlignUp(namesz, 4);
      if (desc + descsz > s.sh_offset + s.sh_size) break;
      if (type == NT_GNU_BUILD_ID && namesz == 4 && std::memcmp(&f[name], "GNU", 4) == 0) {
        if (descsz != id.size()) {
          Fail(path + ": its build-id has " + std::to_string(descsz) + " bytes, '" + hex + "' " +
               std::to_string(id.size()));
        }
        std::memcpy(&f[desc], id.data(), id.size());
        return;
      }
      off = desc + AlignUp(descsz, 4);
    }
  }
  Fail(path + " has no GNU build-id note");
}

}  // namespace

void WriteSparseElf(const std::string& out, uint64_t size_bytes) {
  if (size_bytes < 64 * kGiB) Fail("the sparse file's sections lie up to 64 GiB into it: give at least 64 GiB");
  UniqueFd fd = Create(out);
  Resize(fd.get(), size_bytes);
  const std::vector<uint8_t> text(0x1000, 0xc3);  // ret
  WriteAt(fd.get(), 0x1000, text);
  const uint64_t far = size_bytes - 64 * kGiB;  // every claim sits in the last 28 GiB of holes
  std::vector<Section> sections = {
      {.name = ".text",
       .flags = SHF_ALLOC | SHF_EXECINSTR,
       .addr = 0x1000,
       .offset = 0x1000,
       .size = 0x1000,
       .align = 16},
      {.name = ".note.gnu.build-id",
       .type = SHT_NOTE,
       .flags = SHF_ALLOC,
       .offset = far + 40 * kGiB,
       .size = 3 * kGiB,
       .align = 4},
      {.name = ".dynsym",
       .type = SHT_DYNSYM,
       .flags = SHF_ALLOC,
       .offset = far + 44 * kGiB,
       .size = 6 * kGiB,
       .link = 4,
       .info = 1,
       .align = 8,
       .entsize = sizeof(Elf64_Sym)},
      {.name = ".dynstr", .type = SHT_STRTAB, .flags = SHF_ALLOC, .offset = far + 50 * kGiB, .size = 2 * kGiB},
      {.name = ".symtab",
       .type = SHT_SYMTAB,
       .offset = far + 52 * kGiB,
       .size = 6 * kGiB,
       .link = 6,
       .info = 1,
       .align = 8,
       .entsize = sizeof(Elf64_Sym)},
      {.name = ".strtab", .type = SHT_STRTAB, .offset = far + 58 * kGiB, .size = 3 * kGiB},
      {.name = ".eh_frame", .flags = SHF_ALLOC, .offset = far + 61 * kGiB, .size = 2 * kGiB, .align = 8},
      {.name = ".debug_frame", .offset = far + 36 * kGiB, .size = 4 * kGiB, .align = 8},
      {.name = ".gnu_debuglink", .offset = far + 63 * kGiB, .size = kGiB / 2, .align = 4},
  };
  const std::vector<Elf64_Phdr> phdrs = {
      Segment(PT_LOAD, PF_R | PF_X, 0, 0, 0x2000),
      Segment(PT_NOTE, PF_R, far + 40 * kGiB, 0x10000000, 3 * kGiB),
  };
  WriteHeaders(fd.get(), phdrs, sections, 0x2000);
}

void WriteManySymbolsElf(const std::string& out, uint64_t count) {
  unsigned digits = 7;
  while (digits < 16 && (count - 1) >> (4 * digits) != 0) ++digits;
  const uint64_t name_len = 4 + digits + 1;  // "SSL_" + hex + NUL
  const uint64_t text_off = 0x1000, text_size = AlignUp(std::max<uint64_t>(count, 1), kPage);
  const uint64_t symtab_off = text_off + text_size, symtab_size = (count + 1) * sizeof(Elf64_Sym);
  const uint64_t strtab_off = symtab_off + symtab_size, strtab_size = 1 + count * name_len;
  UniqueFd fd = Create(out);
  Resize(fd.get(), strtab_off + strtab_size);  // .text stays a hole: no symbol's code is ever read or run

  // Written a million symbols at a time: the whole tables would be 36 bytes a symbol in memory.
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<Elf64_Sym> syms;
  std::vector<char> names;
  WriteAt(fd.get(), strtab_off, "", 1);
  Elf64_Sym null_sym{};
  WriteAt(fd.get(), symtab_off, &null_sym, sizeof null_sym);
  static const char kHex[] = "0123456789abcdef";
  for (uint64_t first = 0; first < count; first += kChunk) {
    const uint64_t n = std::min(kChunk, count - first);
    syms.assign(n, Elf64_Sym{});
    names.assign(n * name_len, '\0');
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t i = first + k;
      Elf64_Sym& s = syms[k];
      s.st_name = static_cast<Elf64_Word>(1 + i * name_len);
      s.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
      s.st_shndx = 1;
      s.st_value = text_off + i;
      s.st_size = 1;
      char* name = &names[k * name_len];
      std::memcpy(name, "SSL_", 4);
      for (unsigned d = 0; d < digits; ++d) name[4 + d] = kHex[(i >> (4 * (digits - 1 - d))) & 0xf];
    }
    WriteAt(fd.get(), symtab_off + (1 + first) * sizeof(Elf64_Sym), syms.data(), n * sizeof(Elf64_Sym));
    WriteAt(fd.get(), strtab_off + 1 + first * name_len, names.data(), names.size());
  }
  if (1 + count > UINT32_MAX / name_len) Fail("too many symbols for 32-bit name offsets");
  std::vector<Section> sections = {
      {.name = ".text",
       .flags = SHF_ALLOC | SHF_EXECINSTR,
       .addr = text_off,
       .offset = text_off,
       .size = text_size,
       .align = 16},
      {.name = ".symtab",
       .type = SHT_SYMTAB,
       .offset = symtab_off,
       .size = symtab_size,
       .link = 3,
       .info = 1,
       .align = 8,
       .entsize = sizeof(Elf64_Sym)},
      {.name = ".strtab", .type = SHT_STRTAB, .offset = strtab_off, .size = strtab_size},
  };
  WriteHeaders(fd.get(), {Segment(PT_LOAD, PF_R | PF_X, 0, 0, text_off + text_size)}, sections,
               strtab_off + strtab_size);
}

void WriteLongFdeElf(const std::string& out, uint64_t rows) {
  if (rows < 2 || rows > UINT32_MAX) Fail("rows must be in [2, 2^32)");
  const uint64_t text_off = 0x1000, text_size = AlignUp(rows, 16);
  const uint64_t eh_off = AlignUp(text_off + text_size, 8);
  Bytes eh;
  // The CIE: "zR", code alignment 1, data alignment -8, return address in
  // r16, FDE pointers pc-relative sdata4; CFA = rsp + 8, RA at CFA - 8.
  eh.U32(0);  // length, set below
  eh.U32(0);  // CIE id
  eh.U8(1);   // version
  eh.Str("zR");
  eh.Uleb(1);
  eh.U8(0x78);  // sleb128 -8
  eh.Uleb(16);
  eh.Uleb(1);  // augmentation data length
  eh.U8(DW_EH_PE_pcrel | DW_EH_PE_sdata4);
  eh.U8(DW_CFA_def_cfa);
  eh.Uleb(7);
  eh.Uleb(8);
  eh.U8(DW_CFA_offset | 16);
  eh.Uleb(1);
  eh.PadTo(8, DW_CFA_nop);
  eh.PutU32(0, static_cast<uint32_t>(eh.b.size() - 4));
  // The FDE: `rows` bytes of code, a row at each.
  const size_t fde = eh.b.size();
  eh.U32(0);                               // length, set below
  eh.U32(static_cast<uint32_t>(fde + 4));  // back to the CIE at 0
  eh.U32(static_cast<uint32_t>(static_cast<int64_t>(text_off) - static_cast<int64_t>(eh_off + fde + 8)));
  eh.U32(static_cast<uint32_t>(rows));
  eh.Uleb(0);  // augmentation data length
  eh.b.reserve(eh.b.size() + 3 * rows + 8);
  for (uint64_t i = 1; i < rows; ++i) {
    eh.U8(DW_CFA_advance_loc | 1);
    eh.U8(DW_CFA_def_cfa_offset);
    eh.U8(i % 2 ? 16 : 24);
  }
  eh.PadTo(8, DW_CFA_nop);
  eh.PutU32(fde, static_cast<uint32_t>(eh.b.size() - fde - 4));
  eh.U32(0);  // the terminator
  UniqueFd fd = Create(out);
  WriteAt(fd.get(), text_off, std::vector<uint8_t>(text_size, 0x90));  // nop
  WriteAt(fd.get(), eh_off, eh.b);
  const uint64_t end = eh_off + eh.b.size();
  std::vector<Section> sections = {
      {.name = ".text",
       .flags = SHF_ALLOC | SHF_EXECINSTR,
       .addr = text_off,
       .offset = text_off,
       .size = text_size,
       .align = 16},
      {.name = ".eh_frame", .flags = SHF_ALLOC, .addr = eh_off, .offset = eh_off, .size = eh.b.size(), .align = 8},
  };
  WriteHeaders(fd.get(), {Segment(PT_LOAD, PF_R | PF_X, 0, 0, end)}, sections, end);
}

void WriteSharedPcspGoElf(const std::string& out, uint64_t text_bytes, uint64_t functions) {
  if (functions == 0 || text_bytes % functions != 0 || text_bytes / functions < 2 || text_bytes > UINT32_MAX / 2) {
    Fail("text bytes must be a multiple of the function count, 2 bytes a function at least, under 2 GiB");
  }
  const uint64_t fsize = text_bytes / functions;
  const uint64_t text_off = 0x10000;
  const uint64_t pcl_off = AlignUp(text_off + text_bytes, 64);
  // Go 1.20's pcHeader: magic, 0, 0, quantum 1, pointer size 8, then nfunc,
  // nfiles, textStart and the offsets of funcnametab, cutab, filetab, pctab
  // and pclntab (the functab), all from the table's start.
  Bytes t;
  t.U32(0xfffffff1);
  t.U8(0);
  t.U8(0);
  t.U8(1);
  t.U8(8);
  for (int i = 0; i < 8; ++i) t.U64(0);  // filled below
  const uint64_t names = t.b.size();
  std::vector<uint32_t> nameoff(functions);
  char name[64];
  for (uint64_t i = 0; i < functions; ++i) {
    nameoff[i] = static_cast<uint32_t>(t.b.size() - names);
    std::snprintf(name, sizeof name, "crypto/tls.hostile%06llu", static_cast<unsigned long long>(i));
    t.Str(name);
  }
  t.PadTo(8);
  // The pcsp table every function shares, at pctab + 1 (offset 0 means "no
  // table"): SP 8 below its entry value, then 0, then 8 ..., one byte of code
  // each (value deltas +9, -8, +8 ... zig-zag coded, pc delta 1).
  const uint64_t pctab = t.b.size();
  t.U8(0);
  t.U8(18);
  t.U8(1);
  for (uint64_t i = 1; i < fsize; ++i) {
    t.U8(i % 2 ? 15 : 16);
    t.U8(1);
  }
  t.U8(0);
  t.PadTo(8);
  // The functab ({entry offset, _func offset} per function, then the end) and
  // the _func records (44 bytes: entryOff, nameOff, args, deferreturn, pcsp,
  // pcfile, pcln, npcdata, cuOffset, startLine, funcID, flag, pad, nfuncdata).
  const uint64_t pcln = t.b.size();
  const uint64_t funcs = pcln + (functions + 1) * 8;
  for (uint64_t i = 0; i < functions; ++i) {
    t.U32(static_cast<uint32_t>(i * fsize));
    t.U32(static_cast<uint32_t>(funcs + i * 44 - pcln));
  }
  t.U32(static_cast<uint32_t>(text_bytes));
  t.U32(0);
  for (uint64_t i = 0; i < functions; ++i) {
    t.U32(static_cast<uint32_t>(i * fsize));
    t.U32(nameoff[i]);
    t.U32(0);
    t.U32(0);
    t.U32(1);  // pcsp: the shared table
    for (int k = 0; k < 6; ++k) t.U32(0);
  }
  const uint64_t header[8] = {functions, 0, text_off, names, pcln, pcln, pctab, pcln};
  for (int i = 0; i < 8; ++i) {
    for (int k = 0; k < 8; ++k) t.b[8 + 8 * i + k] = static_cast<uint8_t>(header[i] >> (8 * k));
  }
  // .go.buildinfo: the magic, pointer size 8, flags 2 (strings inline), then
  // the Go version and an empty module info, each length-prefixed.
  Bytes info;
  const char kMagic[] = "\xff Go buildinf:";
  info.b.assign(kMagic, kMagic + 14);
  info.U8(8);
  info.U8(2);
  info.PadTo(32);
  info.Uleb(8);
  for (char c : std::string("go1.20.0")) info.U8(static_cast<uint8_t>(c));
  info.Uleb(0);
  const uint64_t info_off = AlignUp(pcl_off + t.b.size(), 16);
  const uint64_t end = info_off + info.b.size();
  UniqueFd fd = Create(out);
  Resize(fd.get(), end);  // .text stays a hole
  WriteAt(fd.get(), pcl_off, t.b);
  WriteAt(fd.get(), info_off, info.b);
  std::vector<Section> sections = {
      {.name = ".text",
       .flags = SHF_ALLOC | SHF_EXECINSTR,
       .addr = text_off,
       .offset = text_off,
       .size = text_bytes,
       .align = 32},
      {.name = ".gopclntab", .flags = SHF_ALLOC, .addr = pcl_off, .offset = pcl_off, .size = t.b.size(), .align = 32},
      {.name = ".go.buildinfo",
       .flags = SHF_ALLOC | SHF_WRITE,
       .addr = info_off,
       .offset = info_off,
       .size = info.b.size(),
       .align = 16},
  };
  const std::vector<Elf64_Phdr> phdrs = {
      Segment(PT_LOAD, PF_R | PF_X, 0, 0, text_off + text_bytes),
      Segment(PT_LOAD, PF_R, pcl_off, pcl_off, end - pcl_off),
  };
  WriteHeaders(fd.get(), phdrs, sections, end);
}

void CopyWithBuildId(const std::string& in, const std::string& out, const std::string& build_id_hex) {
  std::vector<uint8_t> f = ReadAll(in);
  PatchBuildId(f, Parse(f, in), build_id_hex, in);
  WriteAll(out, f);
}

void CopyWithCraftedSymtab(const std::string& in, const std::string& out, const std::string& prefix,
                           const std::string& build_id_hex) {
  std::vector<uint8_t> f = ReadAll(in);
  const Parsed p = Parse(f, in);
  if (!build_id_hex.empty()) PatchBuildId(f, p, build_id_hex, in);
  // The exported functions, by address.
  struct Range {
    uint64_t start, end;
  };
  std::vector<Range> exported;
  for (const Elf64_Shdr& s : p.shdrs) {
    if (s.sh_type != SHT_DYNSYM || s.sh_entsize != sizeof(Elf64_Sym)) continue;
    for (uint64_t i = 1; i < s.sh_size / sizeof(Elf64_Sym); ++i) {
      Elf64_Sym sym;
      std::memcpy(&sym, &f[s.sh_offset + i * sizeof sym], sizeof sym);
      if (ELF64_ST_TYPE(sym.st_info) == STT_FUNC && sym.st_shndx != SHN_UNDEF && sym.st_size > 0) {
        exported.push_back({sym.st_value, sym.st_value + sym.st_size});
      }
    }
  }
  std::sort(exported.begin(), exported.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  // Every byte of every executable section gets a wrong name: the exported
  // ranges as they are, and the gaps between them (the unexported code).
  std::vector<Elf64_Sym> syms(1);
  Bytes strtab;
  strtab.U8(0);
  auto add = [&](uint64_t start, uint64_t end, size_t section) {
    if (end <= start) return;
    Elf64_Sym s{};
    s.st_name = static_cast<Elf64_Word>(strtab.b.size());
    strtab.Str(prefix + std::to_string(syms.size()));
    s.st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
    s.st_shndx = static_cast<Elf64_Section>(section);
    s.st_value = start;
    s.st_size = end - start;
    syms.push_back(s);
  };
  for (size_t i = 0; i < p.shdrs.size(); ++i) {
    const Elf64_Shdr& s = p.shdrs[i];
    if (!(s.sh_flags & SHF_EXECINSTR) || s.sh_type != SHT_PROGBITS) continue;
    uint64_t at = s.sh_addr;
    const uint64_t end = s.sh_addr + s.sh_size;
    for (const Range& r : exported) {
      if (r.start < at || r.end > end) continue;
      add(at, r.start, i);
      add(r.start, r.end, i);
      at = r.end;
    }
    add(at, end, i);
  }
  // Appended: .symtab, .strtab, a new .shstrtab (the old one with their two
  // names added) and a new section header table that lists them.
  const Elf64_Shdr& old_names = p.shdrs.at(p.ehdr.e_shstrndx);
  Bytes names;
  names.b.assign(f.begin() + static_cast<ptrdiff_t>(old_names.sh_offset),
                 f.begin() + static_cast<ptrdiff_t>(old_names.sh_offset + old_names.sh_size));
  const auto symtab_name = static_cast<Elf64_Word>(names.b.size());
  names.Str(".symtab");
  const auto strtab_name = static_cast<Elf64_Word>(names.b.size());
  names.Str(".strtab");
  const size_t n = p.shdrs.size();
  std::vector<Elf64_Shdr> shdrs = p.shdrs;
  auto append = [&f](const void* data, size_t len, uint64_t align) {
    f.resize(AlignUp(f.size(), align));
    const uint64_t off = f.size();
    f.insert(f.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
    return off;
  };
  Elf64_Shdr symtab{};
  symtab.sh_name = symtab_name;
  symtab.sh_type = SHT_SYMTAB;
  symtab.sh_size = syms.size() * sizeof(Elf64_Sym);
  symtab.sh_offset = append(syms.data(), symtab.sh_size, 8);
  symtab.sh_link = static_cast<Elf64_Word>(n + 1);
  symtab.sh_info = 1;
  symtab.sh_addralign = 8;
  symtab.sh_entsize = sizeof(Elf64_Sym);
  Elf64_Shdr strs{};
  strs.sh_name = strtab_name;
  strs.sh_type = SHT_STRTAB;
  strs.sh_size = strtab.b.size();
  strs.sh_offset = append(strtab.b.data(), strtab.b.size(), 1);
  strs.sh_addralign = 1;
  Elf64_Shdr new_names = old_names;
  new_names.sh_size = names.b.size();
  new_names.sh_offset = append(names.b.data(), names.b.size(), 1);
  shdrs.push_back(symtab);
  shdrs.push_back(strs);
  shdrs.push_back(new_names);
  Elf64_Ehdr e = p.ehdr;
  e.e_shoff = append(shdrs.data(), shdrs.size() * sizeof(Elf64_Shdr), 8);
  e.e_shnum = static_cast<Elf64_Half>(shdrs.size());
  e.e_shstrndx = static_cast<Elf64_Half>(n + 2);
  std::memcpy(f.data(), &e, sizeof e);
  WriteAll(out, f);
}

}  // namespace tlsprof::hostile
