#include "agent/guard/elf_file.h"

#include <algorithm>
#include <cstring>

namespace tlsprof::guard {
namespace {

// The ELF header fields Open() checks before libelf sees the file, read in
// the file's own class and byte order.
struct RawHeader {
  bool is64 = false;
  bool big_endian = false;
  uint64_t shoff = 0, phoff = 0;
  uint64_t shnum = 0, phnum = 0, shstrndx = 0;
  uint64_t shentsize = 0, phentsize = 0;
};

uint64_t Get(const uint8_t* p, size_t n, bool big_endian) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[big_endian ? n - 1 - i : i]} << (8 * i);
  return v;
}

}  // namespace

bool InitLibelf() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

Status ElfFile::ReadRaw(uint64_t offset, std::span<uint8_t> out) const {
  if (offset > size_ || size_ - offset < out.size()) {
    return MakeError("{}: {} bytes at {:#x} lie past the end ({} bytes)", name_, out.size(), offset, size_);
  }
  if (memory_) {
    std::memcpy(out.data(), memory_->data() + offset, out.size());
    return OkStatus();
  }
  return file_->ReadExact(offset, out);
}

Result<ElfFile> ElfFile::Open(const GuardedFile& file) {
  ElfFile f;
  f.file_ = &file;
  f.size_ = file.size();
  f.name_ = file.name();
  return Finish(std::move(f));
}

Result<ElfFile> ElfFile::OpenMemory(std::vector<uint8_t> bytes, std::string name) {
  ElfFile f;
  f.memory_ = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  f.size_ = f.memory_->size();
  f.name_ = std::move(name);
  return Finish(std::move(f));
}

Result<ElfFile> ElfFile::Finish(ElfFile f) {
  if (!InitLibelf()) return MakeError("libelf is too old (elf_version failed)");
  const std::string& path = f.name_;
  // The header, read here: libelf would size its section array and read the
  // header tables from these fields unchecked.
  uint8_t h[64] = {};
  if (f.size_ == 0) return MakeError("{}: empty file, not an ELF binary", path);
  if (auto st = f.ReadRaw(0, std::span<uint8_t>(h, std::min<uint64_t>(sizeof h, f.size_))); !st) return st.error();
  if (f.size_ < SELFMAG || std::memcmp(h, ELFMAG, SELFMAG) != 0) return MakeError("{}: not an ELF file", path);
  if (f.size_ < 52) return MakeError("{}: not an ELF file: too short for an ELF header ({} bytes)", path, f.size_);
  RawHeader r;
  if (h[EI_CLASS] != ELFCLASS32 && h[EI_CLASS] != ELFCLASS64) return MakeError("{}: unknown ELF class", path);
  if (h[EI_DATA] != ELFDATA2LSB && h[EI_DATA] != ELFDATA2MSB) return MakeError("{}: unknown ELF byte order", path);
  r.is64 = h[EI_CLASS] == ELFCLASS64;
  r.big_endian = h[EI_DATA] == ELFDATA2MSB;
  if (r.is64 && f.size_ < 64) return MakeError("{}: too short for an ELF64 header", path);
  auto get = [&](size_t off32, size_t off64, size_t n32, size_t n64) {
    return r.is64 ? Get(h + off64, n64, r.big_endian) : Get(h + off32, n32, r.big_endian);
  };
  r.phoff = get(28, 32, 4, 8);
  r.shoff = get(32, 40, 4, 8);
  r.phentsize = get(42, 54, 2, 2);
  r.phnum = get(44, 56, 2, 2);
  r.shentsize = get(46, 58, 2, 2);
  r.shnum = get(48, 60, 2, 2);
  r.shstrndx = get(50, 62, 2, 2);
  const uint64_t shdr_size = r.is64 ? sizeof(Elf64_Shdr) : sizeof(Elf32_Shdr);
  const uint64_t phdr_size = r.is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr);
  // Extended numbering keeps the real counts in section header 0.
  if (r.shoff != 0 && (r.shnum == 0 || r.phnum == PN_XNUM || r.shstrndx == SHN_XINDEX)) {
    if (r.shentsize != shdr_size)
      return MakeError("{}: section headers are {} bytes, not {}", path, r.shentsize, shdr_size);
    uint8_t s0[64] = {};
    if (auto st = f.ReadRaw(r.shoff, std::span<uint8_t>(s0, shdr_size)); !st) return st.error();
    const uint64_t sh_size = r.is64 ? Get(s0 + 32, 8, r.big_endian) : Get(s0 + 20, 4, r.big_endian);
    const uint64_t sh_link = r.is64 ? Get(s0 + 40, 4, r.big_endian) : Get(s0 + 24, 4, r.big_endian);
    const uint64_t sh_info = r.is64 ? Get(s0 + 44, 4, r.big_endian) : Get(s0 + 28, 4, r.big_endian);
    if (r.shnum == 0) r.shnum = sh_size;
    if (r.phnum == PN_XNUM) r.phnum = sh_info;
    if (r.shstrndx == SHN_XINDEX) r.shstrndx = sh_link;
  }
  if (r.shnum > kMaxSections || r.phnum > kMaxProgramHeaders) {
    Refuse(Reason::kElfHeaders, path,
           fmt::format("{} section and {} program headers (caps {} and {})", r.shnum, r.phnum, kMaxSections,
                       kMaxProgramHeaders));
    return MakeError("{}: {} section and {} program headers, over the agent's caps ({} and {})", path, r.shnum, r.phnum,
                     kMaxSections, kMaxProgramHeaders);
  }
  auto check_table = [&](const char* what, uint64_t off, uint64_t count, uint64_t entsize,
                         uint64_t expected) -> Status {
    if (count == 0) return OkStatus();
    if (entsize != expected) {
      return MakeError("{}: {} entries are {} bytes, expected {}; the ELF header is corrupt", path, what, entsize,
                       expected);
    }
    if (off > f.size_ || (f.size_ - off) / entsize < count) {
      return MakeError(
          "{}: {} table ({} entries at offset {:#x}) extends past the end of the file ({} bytes); the file is "
          "truncated or corrupt",
          path, what, count, off, f.size_);
    }
    return OkStatus();
  };
  if (r.shoff == 0) r.shnum = 0;
  if (auto st = check_table("program header", r.phoff, r.phnum, r.phentsize, phdr_size); !st) return st.error();
  if (auto st = check_table("section header", r.shoff, r.shnum, r.shentsize, shdr_size); !st) return st.error();
  if (r.shnum != 0 && r.shstrndx >= r.shnum)
    return MakeError("{}: section name table {} does not exist", path, r.shstrndx);

  if (f.memory_) {
    f.elf_.reset(elf_memory(reinterpret_cast<char*>(f.memory_->data()), f.memory_->size()));
  } else {
    f.elf_.reset(elf_begin(f.file_->fd(), ELF_C_READ, nullptr));
  }
  if (!f.elf_ || elf_kind(f.elf_.get()) != ELF_K_ELF) return MakeError("{}: cannot read as ELF: {}", path, ElfErr());
  if (gelf_getehdr(f.elf_.get(), &f.ehdr_) == nullptr)
    return MakeError("{}: unreadable ELF header: {}", path, ElfErr());

  f.phdrs_.resize(r.phnum);
  for (size_t i = 0; i < r.phnum; ++i) {
    if (gelf_getphdr(f.elf_.get(), static_cast<int>(i), &f.phdrs_[i]) == nullptr) {
      return MakeError("{}: cannot read program header {} of {}: {}", path, i, r.phnum, ElfErr());
    }
  }
  f.sections_.resize(r.shnum);
  f.loaded_ = std::make_unique<std::vector<bool>>(r.shnum, false);
  for (size_t i = 0; i < r.shnum; ++i) {
    ElfSection& s = f.sections_[i];
    s.index = i;
    s.scn = elf_getscn(f.elf_.get(), i);
    if (s.scn == nullptr || gelf_getshdr(s.scn, &s.shdr) == nullptr) {
      return MakeError("{}: cannot read section header {} of {}: {}", path, i, r.shnum, ElfErr());
    }
  }
  // Names: .shstrtab read through the capped path; a file without a usable
  // one has unnamed sections (readers then find nothing by name).
  if (r.shnum != 0 && r.shstrndx != 0 && f.sections_[r.shstrndx].shdr.sh_type == SHT_STRTAB) {
    for (size_t i = 1; i < r.shnum; ++i) {
      if (auto name = f.StringAt(r.shstrndx, f.sections_[i].shdr.sh_name)) f.sections_[i].name = std::string(*name);
    }
  }
  return f;
}

bool ElfFile::names_read() const {
  size_t shstrndx = 0;
  if (elf_ == nullptr || elf_getshdrstrndx(elf_.get(), &shstrndx) != 0) return false;
  if (shstrndx == 0) return true;
  if (shstrndx >= sections_.size()) return false;
  const ElfSection& names = sections_[shstrndx];
  return names.shdr.sh_type != SHT_STRTAB || names.shdr.sh_size == 0 || data(names) != nullptr;
}

const ElfSection* ElfFile::Find(std::string_view name) const {
  for (const ElfSection& s : sections_) {
    if (s.index != 0 && s.name == name) return &s;
  }
  return nullptr;
}

const ElfSection* ElfFile::FindType(uint32_t type) const {
  for (const ElfSection& s : sections_) {
    if (s.index != 0 && s.shdr.sh_type == type) return &s;
  }
  return nullptr;
}

Result<std::span<const uint8_t>> ElfFile::SectionBytes(const ElfSection& s, uint64_t cap) const {
  if (s.shdr.sh_type == SHT_NOBITS || s.shdr.sh_size == 0) return std::span<const uint8_t>{};
  if (s.index >= sections_.size()) return MakeError("{}: no section {}", name_, s.index);
  if (!(*loaded_)[s.index]) {
    if (s.shdr.sh_size > cap) {
      Refuse(Reason::kSectionSize, name_,
             fmt::format("section {} is {} bytes, over the cap of {}", s.name, s.shdr.sh_size, cap));
      return MakeError("{}: section {} is {} bytes, over the {} bytes the agent reads", name_, s.name, s.shdr.sh_size,
                       cap);
    }
    if (s.shdr.sh_offset > size_ || size_ - s.shdr.sh_offset < s.shdr.sh_size) {
      return MakeError(
          "{}: section {} ({} bytes at offset {:#x}) extends past the end of the file ({} bytes); the file is "
          "truncated or corrupt",
          name_, s.name, s.shdr.sh_size, s.shdr.sh_offset, size_);
    }
    uint64_t in_memory = s.shdr.sh_type == SHT_NOBITS ? 0 : s.shdr.sh_size;
    if (s.shdr.sh_flags & SHF_COMPRESSED) {
      // The Chdr says what the section inflates to; libelf would allocate
      // that much without asking.
      const uint64_t chdr_size = is64() ? sizeof(Elf64_Chdr) : sizeof(Elf32_Chdr);
      uint8_t c[sizeof(Elf64_Chdr)] = {};
      if (s.shdr.sh_size < chdr_size) return MakeError("{}: compressed section {} has no header", name_, s.name);
      if (auto st = ReadRaw(s.shdr.sh_offset, std::span<uint8_t>(c, chdr_size)); !st) return st.error();
      const uint64_t ch_type = Get(c, 4, big_endian());
      const uint64_t ch_size = is64() ? Get(c + 8, 8, big_endian()) : Get(c + 4, 4, big_endian());
      if (ch_type != ELFCOMPRESS_ZLIB) {
        return MakeError("{}: section {} is compressed with type {}, not zlib", name_, s.name, ch_type);
      }
      if (ch_size > cap) {
        Refuse(Reason::kSectionSize, name_,
               fmt::format("compressed section {} inflates to {} bytes, over the cap of {}", s.name, ch_size, cap));
        return MakeError("{}: compressed section {} inflates to {} bytes, over the {} bytes the agent reads", name_,
                         s.name, ch_size, cap);
      }
      in_memory = ch_size;
    }
    // Checked before libelf inflates or reads it.
    if (loaded_bytes_ + in_memory > kMaxImageSectionBytes) return ImageSectionsOverCap(s, in_memory);
    if ((s.shdr.sh_flags & SHF_COMPRESSED) && elf_compress(s.scn, 0, 0) < 0) {
      return MakeError("{}: cannot inflate section {}: {}", name_, s.name, ElfErr());
    }
    loaded_bytes_ += in_memory;
    (*loaded_)[s.index] = true;
  }
  Elf_Data* d = elf_getdata(s.scn, nullptr);
  if (d == nullptr) return MakeError("{}: cannot read section {}: {}", name_, s.name, ElfErr());
  if (d->d_buf == nullptr) return std::span<const uint8_t>{};
  return std::span<const uint8_t>(static_cast<const uint8_t*>(d->d_buf), d->d_size);
}

Error ElfFile::ImageSectionsOverCap(const ElfSection& s, uint64_t bytes) const {
  Refuse(Reason::kSectionSize, name_,
         fmt::format("section {} ({} bytes) would take the sections read of this image to {} bytes, over the cap "
                     "of {}",
                     s.name, bytes, loaded_bytes_ + bytes, kMaxImageSectionBytes));
  return Error{fmt::format("{}: section {} ({} bytes) is past the {} bytes the agent reads of one image", name_, s.name,
                           bytes, kMaxImageSectionBytes)};
}

Elf_Data* ElfFile::data(const ElfSection& s) const {
  if (s.index >= sections_.size() || !(*loaded_)[s.index]) return nullptr;
  return elf_getdata(s.scn, nullptr);
}

std::optional<std::string_view> ElfFile::StringAt(size_t strtab, uint64_t offset) const {
  if (strtab >= sections_.size()) return std::nullopt;
  auto bytes = SectionBytes(sections_[strtab]);
  if (!bytes || offset >= bytes->size()) return std::nullopt;
  const char* begin = reinterpret_cast<const char*>(bytes->data()) + offset;
  const void* nul = std::memchr(begin, '\0', bytes->size() - offset);
  if (nul == nullptr) return std::nullopt;
  return std::string_view(begin, static_cast<const char*>(nul) - begin);
}

Result<std::vector<uint8_t>> ElfFile::Read(uint64_t offset, uint64_t length, uint64_t cap,
                                           std::string_view what) const {
  if (length > cap) {
    Refuse(Reason::kSectionSize, name_, fmt::format("{} is {} bytes, over the cap of {}", what, length, cap));
    return MakeError("{}: {} is {} bytes, over the {} bytes the agent reads at once", name_, what, length, cap);
  }
  if (offset > size_ || size_ - offset < length) {
    return MakeError("{}: {} ({} bytes at {:#x}) extends past the end of the file ({} bytes)", name_, what, length,
                     offset, size_);
  }
  std::vector<uint8_t> out(length);
  if (auto st = ReadRaw(offset, out); !st) return st.error();
  return out;
}

Result<std::vector<uint8_t>> ElfFile::ReadVaddr(uint64_t vaddr, uint64_t length, bool code) const {
  for (const GElf_Phdr& ph : phdrs_) {
    if (ph.p_type != PT_LOAD || (code && !(ph.p_flags & PF_X))) continue;
    if (vaddr < ph.p_vaddr || vaddr - ph.p_vaddr >= ph.p_filesz) continue;
    const uint64_t offset = vaddr - ph.p_vaddr + ph.p_offset;
    if (offset < ph.p_offset || offset >= size_) break;
    const uint64_t end = std::min<uint64_t>(ph.p_offset + std::min(ph.p_filesz, size_ - ph.p_offset), size_);
    const uint64_t n = std::min<uint64_t>(length, end - offset);
    return Read(offset, n, length, "code");
  }
  return MakeError("{}: no {}segment holds address {:#x}", name_, code ? "executable " : "", vaddr);
}

}  // namespace tlsprof::guard
