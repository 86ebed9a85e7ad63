#include "agent/symbols/archive_match.h"

#include "agent/symbols/eh_frame.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "agent/symbols/x86_elf.h"
#include "common/fd.h"

namespace tlsprof::symbols {
namespace {

// ---------------------------------------------------------------------------
// Hashing

uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

// The bytes a relocation at function offset `off` may change once linked:
// the field itself, plus the instruction bytes the x86-64 linker rewrites when
// it relaxes GOT and TLS accesses (mov foo@GOTPCREL -> lea, call *foo@GOTPCREL
// -> addr32 call, TLS GD/LD/IE -> LE sequences). Conservative on purpose: a
// masked byte costs a little specificity, an unmasked relocated byte costs the
// whole match.
ByteRange RelocRange(uint32_t type, uint64_t off) {
  int64_t begin = static_cast<int64_t>(off), end = begin + 4;
  switch (type) {
    case R_X86_64_NONE:
      return {0, 0};
    case R_X86_64_PC32:
    case R_X86_64_PLT32:
    case R_X86_64_32:
    case R_X86_64_32S:
    case R_X86_64_GOTPCREL:
    case R_X86_64_GOT32:
    case R_X86_64_TPOFF32:
    case R_X86_64_DTPOFF32:
    case R_X86_64_GOTPC32:
      break;
    case R_X86_64_64:
    case R_X86_64_PC64:
    case R_X86_64_GOTOFF64:
    case R_X86_64_GOTPC64:
    case R_X86_64_GOT64:
    case R_X86_64_GOTPCREL64:
    case R_X86_64_GOTPLT64:
    case R_X86_64_PLTOFF64:
    case R_X86_64_DTPOFF64:
    case R_X86_64_TPOFF64:
    case R_X86_64_SIZE64:
      end = begin + 8;
      break;
    case R_X86_64_16:
    case R_X86_64_PC16:
      end = begin + 2;
      break;
    case R_X86_64_8:
    case R_X86_64_PC8:
      end = begin + 1;
      break;
    case R_X86_64_GOTPCRELX:  // ff 15/25 or 8b: opcode and ModRM may change
      begin -= 2;
      break;
    case R_X86_64_REX_GOTPCRELX:  // REX, opcode, ModRM may change
    case R_X86_64_GOTTPOFF:
    case R_X86_64_GOTPC32_TLSDESC:
      begin -= 3;
      break;
    case R_X86_64_TLSDESC_CALL:  // call *(%rax) -> nop
      end = begin + 2;
      break;
    case R_X86_64_TLSGD:  // 16-byte lea + call sequence
      begin -= 4;
      end = begin + 16;
      break;
    case R_X86_64_TLSLD:  // 12-byte lea + call sequence
      begin -= 3;
      end = begin + 12;
      break;
    default:  // unknown: a wide window
      begin -= 4;
      end = begin + 16;
      break;
  }
  if (begin < 0) begin = 0;
  return {static_cast<uint32_t>(begin), static_cast<uint32_t>(std::max<int64_t>(end, begin))};
}

// ---------------------------------------------------------------------------
// .eh_frame FDE ranges (the same walk as agent/unwind's table builder, which
// also decodes the CFI rows; here only [start, end) is needed).

struct Range {
  uint64_t start = 0, len = 0;
};

// FDE ranges of an .eh_frame section (already read; `vaddr` is its address).
std::vector<Range> EhFrameRanges(Elf* elf, Elf_Data* data, uint64_t vaddr) {
  std::vector<Range> out;
  uint64_t errors = 0;  // undecodable entries just give no candidate range
  eh::ForEachFde(elf, data, /*eh_frame=*/true, vaddr, &errors, [&out](uint64_t start, uint64_t len) {
    out.push_back({start, len});
  });
  return out;
}

// Walks the ar member headers ("!<arch>\n", then 60-byte headers each
// followed by the member, padded to an even size) and checks that they tile
// the file exactly. libelf reads members lazily and quietly shortens or stops
// at a member that runs past the end, so a truncated archive would otherwise
// look like a smaller, valid one.
Status CheckArLayout(int fd, std::string_view path, uint64_t file_size) {
  char magic[8];
  if (file_size < 8 || pread(fd, magic, 8, 0) != 8) return MakeError("{}: too short for an ar archive", path);
  if (std::memcmp(magic, "!<thin>\n", 8) == 0) return MakeError("{}: thin archives are not supported", path);
  if (std::memcmp(magic, "!<arch>\n", 8) != 0) return MakeError("{}: not an ar archive", path);
  uint64_t pos = 8;
  size_t members = 0;
  while (pos < file_size) {
    char hdr[60];
    if (file_size - pos < sizeof hdr || pread(fd, hdr, sizeof hdr, static_cast<off_t>(pos)) != sizeof hdr) {
      return MakeError("{}: member header {} at offset {:#x} is cut off; the archive is truncated", path, members, pos);
    }
    if (hdr[58] != '`' || hdr[59] != '\n') {
      return MakeError("{}: member header {} at offset {:#x} is corrupt", path, members, pos);
    }
    uint64_t size = 0;
    int digits = 0;
    for (int k = 48; k < 58 && hdr[k] != ' '; ++k, ++digits) {
      if (hdr[k] < '0' || hdr[k] > '9') {
        return MakeError("{}: member header {} at offset {:#x} has a bad size field", path, members, pos);
      }
      size = size * 10 + static_cast<uint64_t>(hdr[k] - '0');
    }
    if (digits == 0) return MakeError("{}: member header {} at offset {:#x} has no size", path, members, pos);
    pos += sizeof hdr;
    if (file_size - pos < size) {
      return MakeError(
          "{}: member {} ({} bytes at offset {:#x}) runs past the end of the file ({} bytes); "
          "the archive is truncated",
          path, members, size, pos, file_size);
    }
    pos += size;
    if ((size & 1) && pos < file_size) ++pos;  // padding (may be missing at the very end)
    ++members;
  }
  if (members == 0) return MakeError("{}: empty archive", path);
  return OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// ArchiveIndex

uint64_t ArchiveIndex::MaskedHash(std::span<const uint8_t> bytes, std::span<const ByteRange> mask) {
  uint64_t h = Mix(bytes.size() + 0x9e3779b97f4a7c15ULL);
  size_t pos = 0;
  auto feed = [&](size_t from, size_t to) {  // bytes [from, to), as 8-byte words
    while (from + 8 <= to) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + from, 8);
      h = Mix(h ^ w) + from;
      from += 8;
    }
    uint64_t w = 0;
    if (from < to) {
      std::memcpy(&w, bytes.data() + from, to - from);
      h = Mix(h ^ w ^ (uint64_t(to - from) << 56)) + from;
    }
  };
  for (const ByteRange& r : mask) {
    size_t b = std::min<size_t>(r.begin, bytes.size()), e = std::min<size_t>(r.end, bytes.size());
    if (b > pos) feed(pos, b);
    pos = std::max(pos, e);
    h = Mix(h ^ (0xa5a5a5a5ULL + e));  // the mask's shape is part of the hash
  }
  if (pos < bytes.size()) feed(pos, bytes.size());
  return h;
}

std::span<const ByteRange> ArchiveIndex::mask(uint32_t id) const {
  if (id + 1 >= mask_begin_.size()) return {};
  return std::span<const ByteRange>(mask_ranges_).subspan(mask_begin_[id], mask_begin_[id + 1] - mask_begin_[id]);
}

std::span<const uint32_t> ArchiveIndex::WithSize(uint64_t size) const {
  auto lo =
      std::partition_point(by_size_.begin(), by_size_.end(), [&](uint32_t i) { return functions_[i].size < size; });
  auto hi = std::partition_point(lo, by_size_.end(), [&](uint32_t i) { return functions_[i].size <= size; });
  return {by_size_.data() + (lo - by_size_.begin()), static_cast<size_t>(hi - lo)};
}

std::span<const uint32_t> ArchiveIndex::GlobalsNamed(std::string_view name) const {
  auto it = globals_.find(name);
  if (it == globals_.end()) return {};
  return it->second;
}

std::span<const uint32_t> ArchiveIndex::InSection(uint32_t section) const {
  if (section + 1 >= section_begin_.size()) return {};
  return std::span<const uint32_t>(by_section_)
      .subspan(section_begin_[section], section_begin_[section + 1] - section_begin_[section]);
}

size_t ArchiveIndex::memory_bytes() const {
  size_t n = sizeof(*this) + functions_.capacity() * sizeof(ArchiveFunction) +
             mask_ranges_.capacity() * sizeof(ByteRange) +
             (mask_begin_.capacity() + section_members_.capacity() + by_size_.capacity() + by_section_.capacity() +
              section_begin_.capacity()) *
                 sizeof(uint32_t);
  for (const ArchiveFunction& f : functions_) {
    if (f.name.size() >= sizeof(std::string)) n += f.name.capacity() + 1;
  }
  for (const auto& [name, v] : globals_) n += 48 + v.capacity() * sizeof(uint32_t);
  return n;
}

class ArchiveIndexBuilder {
 public:
  ArchiveIndexBuilder(int fd, std::string path, uint64_t file_size)
      : fd_(fd), file_size_(file_size), index_(std::make_shared<ArchiveIndex>()) {
    index_->path_ = std::move(path);
  }

  Result<std::shared_ptr<const ArchiveIndex>> Build() {
    if (!InitLibelf()) return MakeError("libelf is too old (elf_version failed)");
    const std::string& path = index_->path_;
    if (auto st = CheckArLayout(fd_, path, file_size_); !st) return st.error();
    ElfPtr ar(elf_begin(fd_, ELF_C_READ, nullptr));
    if (!ar) return MakeError("{}: cannot read: {}", path, ElfErr());
    if (elf_kind(ar.get()) != ELF_K_AR) return MakeError("{}: not an ar archive", path);
    Elf_Cmd cmd = ELF_C_READ;
    size_t member = 0;
    for (;;) {
      ElfPtr m(elf_begin(fd_, cmd, ar.get()));
      if (!m) {
        // elf_begin returns NULL both at the end and on a corrupt member
        // header; elf_errno tells them apart.
        if (int err = elf_errno(); err != 0) {
          return MakeError("{}: corrupt archive after member {}: {}", path, member, elf_errmsg(err));
        }
        break;
      }
      ++member;
      Elf_Arhdr* hdr = elf_getarhdr(m.get());
      if (hdr == nullptr) return MakeError("{}: member {} has no readable header: {}", path, member, ElfErr());
      std::string name = hdr->ar_name != nullptr ? hdr->ar_name : "?";
      // The member must lie inside the file: libelf does not check this for
      // members it reads lazily.
      int64_t base = elf_getbase(m.get());
      if (base < 0 || static_cast<uint64_t>(base) > file_size_ ||
          file_size_ - static_cast<uint64_t>(base) < static_cast<uint64_t>(hdr->ar_size)) {
        return MakeError("{}: member {} ({} bytes) extends past the end of the archive; truncated?", path, name,
                         static_cast<uint64_t>(hdr->ar_size));
      }
      if (elf_kind(m.get()) == ELF_K_ELF) {
        auto st = AddMember(m.get(), name, static_cast<uint64_t>(hdr->ar_size));
        if (!st) return MakeError("{}: member {}: {}", path, name, st.error().message);
        ++index_->members_;
      }
      cmd = elf_next(m.get());
      if (cmd == ELF_C_NULL) break;
    }
    if (index_->functions_.empty()) return MakeError("{}: no ELF x86-64 functions in the archive", path);
    Finish();
    return std::shared_ptr<const ArchiveIndex>(std::move(index_));
  }

 private:
  Status AddMember(Elf* m, const std::string& member_name, uint64_t member_size) {
    GElf_Ehdr ehdr;
    if (gelf_getehdr(m, &ehdr) == nullptr) return MakeError("unreadable ELF header: {}", ElfErr());
    if (ehdr.e_type != ET_REL || ehdr.e_machine != EM_X86_64 || gelf_getclass(m) != ELFCLASS64 ||
        ehdr.e_ident[EI_DATA] != ELFDATA2LSB) {
      return OkStatus();  // not something this matcher understands: ignored
    }
    size_t shnum = 0;
    if (elf_getshdrnum(m, &shnum) != 0) return MakeError("cannot read the section count: {}", ElfErr());
    if (shnum > 0 && (ehdr.e_shentsize != sizeof(Elf64_Shdr) || ehdr.e_shoff > member_size ||
                      (member_size - ehdr.e_shoff) / sizeof(Elf64_Shdr) < shnum)) {
      return MakeError("section header table past the end of the member");
    }
    std::vector<GElf_Shdr> shdrs(shnum);
    std::vector<Elf_Scn*> scns(shnum);
    for (size_t i = 0; i < shnum; ++i) {
      scns[i] = elf_getscn(m, i);
      if (scns[i] == nullptr || gelf_getshdr(scns[i], &shdrs[i]) == nullptr) {
        return MakeError("cannot read section header {}: {}", i, ElfErr());
      }
      const GElf_Shdr& s = shdrs[i];
      if (s.sh_type != SHT_NOBITS && (s.sh_offset > member_size || member_size - s.sh_offset < s.sh_size)) {
        return MakeError("section {} ({} bytes at {:#x}) extends past the end of the member ({} bytes)", i, s.sh_size,
                         s.sh_offset, member_size);
      }
    }
    auto bytes_of = [&](size_t i) -> Result<std::span<const uint8_t>> {
      if (shdrs[i].sh_type == SHT_NOBITS || shdrs[i].sh_size == 0) return std::span<const uint8_t>{};
      Elf_Data* d = elf_getdata(scns[i], nullptr);
      if (d == nullptr) return MakeError("cannot read section {}: {}", i, ElfErr());
      if (d->d_buf == nullptr) return std::span<const uint8_t>{};
      return std::span<const uint8_t>(static_cast<const uint8_t*>(d->d_buf), d->d_size);
    };
    size_t symtab = 0;
    for (size_t i = 1; i < shnum; ++i) {
      if (shdrs[i].sh_type == SHT_SYMTAB) {
        symtab = i;
        break;
      }
    }
    if (symtab == 0) return OkStatus();  // nothing named
    auto is_code = [&](size_t i) {
      return i < shnum && (shdrs[i].sh_flags & SHF_EXECINSTR) && shdrs[i].sh_type == SHT_PROGBITS;
    };

    // Relocation offsets per code section, sorted.
    std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>> relocs;
    for (size_t i = 1; i < shnum; ++i) {
      if (shdrs[i].sh_type != SHT_RELA && shdrs[i].sh_type != SHT_REL) continue;
      if (!is_code(shdrs[i].sh_info)) continue;
      if (shdrs[i].sh_type == SHT_REL) return MakeError("SHT_REL relocations (not x86-64 RELA)");
      auto b = bytes_of(i);
      if (!b) return b.error();
      Elf_Data* d = b->empty() ? nullptr : elf_getdata(scns[i], nullptr);
      auto& v = relocs[shdrs[i].sh_info];
      const size_t n = b->size() / sizeof(Elf64_Rela);
      for (size_t k = 0; k < n; ++k) {
        GElf_Rela r;
        if (gelf_getrela(d, static_cast<int>(k), &r) == nullptr) return MakeError("bad relocation {}", k);
        v.emplace_back(r.r_offset, static_cast<uint32_t>(GELF_R_TYPE(r.r_info)));
      }
      std::sort(v.begin(), v.end());
    }

    const GElf_Shdr& symhdr = shdrs[symtab];
    if (symhdr.sh_link == 0 || symhdr.sh_link >= shnum || shdrs[symhdr.sh_link].sh_type != SHT_STRTAB) {
      return MakeError(".symtab links to section {}, which is not a string table", symhdr.sh_link);
    }
    auto strtab = bytes_of(symhdr.sh_link);
    if (!strtab) return strtab.error();
    auto syms = bytes_of(symtab);
    if (!syms) return syms.error();
    Elf_Data* symdata = syms->empty() ? nullptr : elf_getdata(scns[symtab], nullptr);
    const size_t nsyms = syms->size() / sizeof(Elf64_Sym);
    std::map<size_t, std::span<const uint8_t>> code;  // section bytes, read on demand
    std::map<size_t, uint32_t> section_ids;
    std::map<std::tuple<size_t, uint64_t, uint64_t>, uint32_t> bodies;
    for (size_t k = 1; k < nsyms; ++k) {
      GElf_Sym sym;
      if (gelf_getsym(symdata, static_cast<int>(k), &sym) == nullptr) return MakeError("bad symbol {}", k);
      const int type = GELF_ST_TYPE(sym.st_info);
      const size_t shndx = sym.st_shndx;
      if (sym.st_name == 0 || sym.st_size == 0 || shndx == SHN_UNDEF || shndx >= SHN_LORESERVE) continue;
      if (!is_code(shndx)) continue;
      if (type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_NOTYPE) continue;
      if (sym.st_name >= strtab->size()) return MakeError("symbol {} has a name outside .strtab", k);
      const char* nb = reinterpret_cast<const char*>(strtab->data()) + sym.st_name;
      const void* nul = std::memchr(nb, '\0', strtab->size() - sym.st_name);
      if (nul == nullptr) return MakeError("symbol {} has an unterminated name", k);
      std::string_view name(nb, static_cast<const char*>(nul) - nb);
      if (name.empty()) continue;
      auto it = code.find(shndx);
      if (it == code.end()) {
        auto b = bytes_of(shndx);
        if (!b) return b.error();
        it = code.emplace(shndx, *b).first;
      }
      std::span<const uint8_t> sec = it->second;
      if (sym.st_value > sec.size() || sec.size() - sym.st_value < sym.st_size) {
        ++skipped_;  // a size past its section: not trusted, not fatal
        continue;
      }
      if (sym.st_size > (1u << 28)) continue;
      std::span<const uint8_t> body = sec.subspan(sym.st_value, sym.st_size);

      scratch_.clear();
      if (auto r = relocs.find(shndx); r != relocs.end()) {
        auto lo = std::lower_bound(r->second.begin(), r->second.end(), std::make_pair(sym.st_value, uint32_t{0}));
        for (; lo != r->second.end() && lo->first < sym.st_value + sym.st_size; ++lo) {
          ByteRange br = RelocRange(lo->second, lo->first - sym.st_value);
          br.end = std::min<uint32_t>(br.end, static_cast<uint32_t>(sym.st_size));
          if (br.begin < br.end) scratch_.push_back(br);
        }
      }
      // Sorted, merged ranges.
      std::sort(scratch_.begin(), scratch_.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
      std::vector<ByteRange> merged;
      uint32_t masked = 0;
      for (const ByteRange& r : scratch_) {
        if (!merged.empty() && r.begin <= merged.back().end) {
          merged.back().end = std::max(merged.back().end, r.end);
        } else {
          merged.push_back(r);
        }
      }
      for (const ByteRange& r : merged) masked += r.end - r.begin;

      ArchiveFunction f;
      f.name = std::string(name);
      f.size = sym.st_size;
      f.offset = sym.st_value;
      f.mask = InternMask(merged);
      f.hash = ArchiveIndex::MaskedHash(body, merged);
      f.unmasked = static_cast<uint32_t>(sym.st_size - masked);
      f.global = GELF_ST_BIND(sym.st_info) != STB_LOCAL;
      auto sid = section_ids.find(shndx);
      if (sid == section_ids.end()) {
        sid = section_ids.emplace(shndx, static_cast<uint32_t>(index_->section_members_.size())).first;
        index_->section_members_.push_back(static_cast<uint32_t>(index_->members_));
      }
      f.section = sid->second;
      auto [b, inserted] =
          bodies.emplace(std::make_tuple(shndx, sym.st_value, sym.st_size), static_cast<uint32_t>(next_body_));
      if (inserted) ++next_body_;
      f.body = b->second;
      index_->functions_.push_back(std::move(f));
    }
    (void)member_name;
    return OkStatus();
  }

  uint32_t InternMask(const std::vector<ByteRange>& ranges) {
    std::string key(reinterpret_cast<const char*>(ranges.data()), ranges.size() * sizeof(ByteRange));
    auto [it, inserted] = masks_.emplace(std::move(key), static_cast<uint32_t>(index_->mask_begin_.size()));
    if (inserted) {
      index_->mask_begin_.push_back(static_cast<uint32_t>(index_->mask_ranges_.size()));
      index_->mask_ranges_.insert(index_->mask_ranges_.end(), ranges.begin(), ranges.end());
    }
    return it->second;
  }

  void Finish() {
    ArchiveIndex& x = *index_;
    x.mask_begin_.push_back(static_cast<uint32_t>(x.mask_ranges_.size()));
    const auto& fn = x.functions_;
    const uint32_t n = static_cast<uint32_t>(fn.size());
    x.by_size_.resize(n);
    for (uint32_t i = 0; i < n; ++i) x.by_size_[i] = i;
    x.by_section_ = x.by_size_;
    // Same-size candidates sharing a mask are adjacent: the .so side hashes
    // once per run.
    std::sort(x.by_size_.begin(), x.by_size_.end(), [&](uint32_t a, uint32_t b) {
      return std::tie(fn[a].size, fn[a].mask, fn[a].hash) < std::tie(fn[b].size, fn[b].mask, fn[b].hash);
    });
    std::sort(x.by_section_.begin(), x.by_section_.end(), [&](uint32_t a, uint32_t b) {
      return std::tie(fn[a].section, fn[a].offset, fn[a].body, a) <
             std::tie(fn[b].section, fn[b].offset, fn[b].body, b);
    });
    const uint32_t nsec = static_cast<uint32_t>(x.section_members_.size());
    x.section_begin_.assign(nsec + 1, n);
    for (uint32_t k = n; k-- > 0;) x.section_begin_[fn[x.by_section_[k]].section] = k;
    for (uint32_t s = nsec; s-- > 0;) x.section_begin_[s] = std::min(x.section_begin_[s], x.section_begin_[s + 1]);
    // functions_ must not move after this: globals_ keys are views of its names.
    x.functions_.shrink_to_fit();
    for (uint32_t i = 0; i < n; ++i) {
      if (fn[i].global) x.globals_[fn[i].name].push_back(i);
    }
    x.mask_ranges_.shrink_to_fit();
    x.mask_begin_.shrink_to_fit();
    x.section_members_.shrink_to_fit();
    if (skipped_ > 0) spdlog::debug("{}: {} symbols extend past their section; ignored", x.path_, skipped_);
  }

  int fd_;
  uint64_t file_size_;
  std::shared_ptr<ArchiveIndex> index_;
  std::unordered_map<std::string, uint32_t> masks_;
  std::vector<ByteRange> scratch_;
  size_t next_body_ = 0;
  size_t skipped_ = 0;
};

Result<std::shared_ptr<const ArchiveIndex>> ArchiveIndex::Load(int fd, std::string_view path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return MakeError("{}: fstat failed: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return MakeError("{}: not a regular file", path);
  return ArchiveIndexBuilder(fd, std::string(path), static_cast<uint64_t>(st.st_size)).Build();
}

Result<std::shared_ptr<const ArchiveIndex>> GetArchiveIndex(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return MakeError("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return MakeError("{}: fstat failed: {}", path, std::strerror(errno));
  std::string key =
      fmt::format("{}:{}:{}:{}.{:09}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const ArchiveIndex>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto index = ArchiveIndex::Load(fd.get(), path);
  if (!index) return index.error();
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(std::move(key), std::move(*index)).first->second;
}

// ---------------------------------------------------------------------------
// Matching

namespace {

// The executable PT_LOAD segments of the .so, read with pread (no mapping:
// a library truncated while we read it must not SIGBUS the agent).
struct CodeImage {
  struct Segment {
    uint64_t vaddr = 0;
    std::vector<uint8_t> bytes;
  };
  std::vector<Segment> segments;

  std::span<const uint8_t> Read(uint64_t vaddr, uint64_t len) const {
    for (const Segment& s : segments) {
      if (vaddr >= s.vaddr && vaddr - s.vaddr <= s.bytes.size() && s.bytes.size() - (vaddr - s.vaddr) >= len) {
        return std::span<const uint8_t>(s.bytes).subspan(vaddr - s.vaddr, len);
      }
    }
    return {};
  }
};

struct Export {
  uint64_t addr = 0, size = 0;
  std::string name;
};

struct SoView {
  CodeImage code;
  std::vector<Range> fdes;
  std::vector<Export> exports;
};

Result<SoView> ReadSo(int fd, std::string_view path) {
  auto opened = OpenX86Elf(fd, path);
  if (!opened) return opened.error();
  const ElfPtr& elf = opened->elf;
  const uint64_t file_size = opened->file_size;
  SoView so;
  auto code = ReadLoadSegments(fd, *opened, path, /*code_only=*/true, /*max_bytes=*/1ull << 32);
  if (!code) return code.error();
  for (LoadedSegment& seg : *code) so.code.segments.push_back({seg.vaddr, std::move(seg.bytes)});
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf.get(), &shstrndx) != 0) return MakeError("{}: no section name table", path);
  for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn != nullptr; scn = elf_nextscn(elf.get(), scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) return MakeError("{}: bad section header", path);
    if (sh.sh_type == SHT_NOBITS || sh.sh_size == 0) continue;
    if (sh.sh_offset > file_size || file_size - sh.sh_offset < sh.sh_size) {
      return MakeError("{}: a section extends past the end of the file", path);
    }
    const char* name = elf_strptr(elf.get(), shstrndx, sh.sh_name);
    if (sh.sh_type == SHT_PROGBITS && name != nullptr && std::strcmp(name, ".eh_frame") == 0) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d != nullptr) so.fdes = EhFrameRanges(elf.get(), d, sh.sh_addr);
    } else if (sh.sh_type == SHT_DYNSYM) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d == nullptr) continue;
      const size_t n = d->d_size / sizeof(Elf64_Sym);
      for (size_t k = 1; k < n; ++k) {
        GElf_Sym sym;
        if (gelf_getsym(d, static_cast<int>(k), &sym) == nullptr) break;
        if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_size == 0) continue;
        const char* sn = elf_strptr(elf.get(), sh.sh_link, sym.st_name);
        if (sn == nullptr || *sn == '\0') continue;
        so.exports.push_back({sym.st_value, sym.st_size, sn});
      }
    }
  }
  std::sort(so.exports.begin(), so.exports.end(),
            [](const Export& a, const Export& b) { return std::tie(a.name, a.addr) < std::tie(b.name, b.addr); });
  so.exports.erase(std::unique(so.exports.begin(), so.exports.end(),
                               [](const Export& a, const Export& b) { return a.name == b.name && a.addr == b.addr; }),
                   so.exports.end());
  std::sort(so.fdes.begin(), so.fdes.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  return so;
}

bool Matches(const ArchiveIndex& index, const ArchiveFunction& f, std::span<const uint8_t> bytes) {
  return bytes.size() == f.size && ArchiveIndex::MaskedHash(bytes, index.mask(f.mask)) == f.hash;
}

}  // namespace

Result<ArchiveMatch> MatchArchive(int so_fd, std::string_view so_path, const ArchiveIndex& index,
                                  const ArchiveMatchOptions& options) {
  auto read = ReadSo(so_fd, so_path);
  if (!read) return read.error();
  const SoView& so = *read;
  const auto& fn = index.functions();
  ArchiveMatch out;
  ArchiveMatchStats& stats = out.stats;

  // Anchor votes: section id -> base address -> votes.
  std::map<uint32_t, std::map<uint64_t, uint32_t>> votes;

  // 1. Is the archive from this build?
  for (const Export& e : so.exports) {
    ++stats.exports;
    std::span<const uint32_t> globals = index.GlobalsNamed(e.name);
    if (globals.empty()) continue;
    ++stats.exports_checked;
    std::span<const uint8_t> bytes = so.code.Read(e.addr, e.size);
    for (uint32_t g : globals) {
      if (Matches(index, fn[g], bytes)) {
        ++stats.exports_matched;
        if (options.anchor_on_exports) ++votes[fn[g].section][e.addr - fn[g].offset];
        break;
      }
    }
  }
  if (stats.exports_checked == 0 ||
      static_cast<double>(stats.exports_checked) < options.min_export_coverage * static_cast<double>(stats.exports)) {
    return MakeError("{}: archive {} defines {} of the library's {} exported functions; not its static counterpart",
                     so_path, index.path(), stats.exports_checked, stats.exports);
  }
  if (static_cast<double>(stats.exports_matched) <
      options.min_export_match * static_cast<double>(stats.exports_checked)) {
    return MakeError("{}: only {} of {} exported functions match their code in {}; the archive is from another build",
                     so_path, stats.exports_matched, stats.exports_checked, index.path());
  }

  // 2. FDE ranges.
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint32_t>>> named;  // addr -> (size, function indices)
  std::vector<uint32_t> hits;
  std::vector<Range> ambiguous;
  for (const Range& r : so.fdes) {
    std::span<const uint8_t> bytes = so.code.Read(r.start, r.len);
    if (bytes.empty()) continue;
    ++stats.fde_ranges;
    std::span<const uint32_t> cands = index.WithSize(r.len);
    if (cands.empty()) {
      ++stats.fde_no_candidate;
      continue;
    }
    hits.clear();
    uint32_t last_mask = UINT32_MAX;
    uint64_t h = 0;
    for (uint32_t c : cands) {
      if (fn[c].mask != last_mask) {
        last_mask = fn[c].mask;
        h = ArchiveIndex::MaskedHash(bytes, index.mask(last_mask));
      }
      if (h == fn[c].hash) hits.push_back(c);
    }
    if (hits.empty()) {
      ++stats.fde_no_match;
      continue;
    }
    bool one_body = std::all_of(hits.begin(), hits.end(), [&](uint32_t c) { return fn[c].body == fn[hits[0]].body; });
    bool one_name = std::all_of(hits.begin(), hits.end(), [&](uint32_t c) { return fn[c].name == fn[hits[0]].name; });
    if (!one_body && !one_name) {
      ++stats.fde_ambiguous;
      ambiguous.push_back(r);
      continue;
    }
    uint32_t unmasked = UINT32_MAX;
    for (uint32_t c : hits) unmasked = std::min(unmasked, fn[c].unmasked);
    if (unmasked < options.min_unique_bytes) {
      ++stats.fde_too_small;
      continue;
    }
    ++stats.fde_unique;
    if (one_body) {
      ++votes[fn[hits[0]].section][r.start - fn[hits[0]].offset];
      named[r.start] = {r.len, hits};
    } else {
      named[r.start] = {r.len, {hits[0]}};
    }
  }

  // 3. Anchored sections.
  // Checks every function of `section` at `base`; returns the bytes they
  // cover and the unmasked bytes that matched, or nullopt if one differs.
  struct Fit {
    uint64_t begin = 0, end = 0, weight = 0;
    uint32_t section = 0;
    uint64_t base = 0;
  };
  auto fit = [&](uint32_t section, uint64_t base) -> std::optional<Fit> {
    Fit f{UINT64_MAX, 0, 0, section, base};
    for (uint32_t c : index.InSection(section)) {
      const ArchiveFunction& a = fn[c];
      if (!Matches(index, a, so.code.Read(base + a.offset, a.size))) return std::nullopt;
      f.begin = std::min(f.begin, base + a.offset);
      f.end = std::max(f.end, base + a.offset + a.size);
      f.weight += a.unmasked;
    }
    return f;
  };
  // Names the functions of `section` that match at `base`; returns how many
  // addresses were new.
  auto place = [&](uint32_t section, uint64_t base) {
    uint64_t added = 0;
    std::span<const uint32_t> members = index.InSection(section);
    for (size_t k = 0; k < members.size();) {
      // Aliases (one body) are adjacent: same offset.
      size_t e = k + 1;
      while (e < members.size() && fn[members[e]].body == fn[members[k]].body) ++e;
      const ArchiveFunction& f = fn[members[k]];
      const uint64_t addr = base + f.offset;
      std::span<const uint8_t> bytes = so.code.Read(addr, f.size);
      if (!bytes.empty() && Matches(index, f, bytes) && !named.contains(addr)) {
        named[addr] = {f.size, std::vector<uint32_t>(members.begin() + k, members.begin() + e)};
        ++added;
      }
      k = e;
    }
    return added;
  };
  std::vector<std::pair<uint64_t, uint64_t>> taken;  // [begin, end) of placed sections
  for (const auto& [section, bases] : votes) {
    if (bases.size() != 1) {
      ++stats.conflicting_sections;
      continue;
    }
    ++stats.anchored_sections;
    const uint64_t base = bases.begin()->first;
    stats.anchored_functions += place(section, base);
    uint64_t b = UINT64_MAX, e = 0;
    for (uint32_t c : index.InSection(section)) {
      b = std::min(b, base + fn[c].offset);
      e = std::max(e, base + fn[c].offset + fn[c].size);
    }
    if (b < e) taken.emplace_back(b, e);
  }

  // 3b. Sections without an anchor whose whole layout fits where an
  // ambiguous range points (a file of macro-generated wrappers that are
  // identical one by one, but not as a sequence). A fit overlapping a placed
  // section, another fit of a similar weight, or the same section elsewhere is
  // not used.
  // Candidates: (section, base) pairs that at least two ambiguous ranges
  // point to, for sections without anchors. (A section of one function
  // cannot be told from its twins by layout.)
  std::vector<std::pair<uint32_t, uint64_t>> layout_candidates;
  for (const Range& r : ambiguous) {
    std::span<const uint8_t> bytes = so.code.Read(r.start, r.len);
    uint32_t last_mask = UINT32_MAX;
    uint64_t h = 0;
    for (uint32_t c : index.WithSize(r.len)) {
      if (votes.contains(fn[c].section)) continue;
      if (fn[c].mask != last_mask) {
        last_mask = fn[c].mask;
        h = ArchiveIndex::MaskedHash(bytes, index.mask(last_mask));
      }
      if (h == fn[c].hash) layout_candidates.emplace_back(fn[c].section, r.start - fn[c].offset);
    }
  }
  std::sort(layout_candidates.begin(), layout_candidates.end());
  std::vector<Fit> fits;
  std::map<uint32_t, int> fits_per_section;
  for (size_t k = 0; k < layout_candidates.size();) {
    size_t e = k + 1;
    while (e < layout_candidates.size() && layout_candidates[e] == layout_candidates[k]) ++e;
    const auto [section, base] = layout_candidates[k];
    const bool supported = e - k >= 2;
    k = e;
    if (!supported) continue;
    std::optional<Fit> f = fit(section, base);
    if (!f || f->weight < options.min_layout_bytes) continue;
    fits.push_back(*f);
    ++fits_per_section[section];
  }
  std::sort(taken.begin(), taken.end());
  auto overlaps_taken = [&](const Fit& f) {
    auto it = std::lower_bound(taken.begin(), taken.end(), std::make_pair(f.end, uint64_t{0}));
    return it != taken.begin() && std::prev(it)->second > f.begin;
  };
  std::sort(fits.begin(), fits.end(), [](const Fit& a, const Fit& b) { return a.begin < b.begin; });
  for (size_t k = 0; k < fits.size();) {
    size_t e = k + 1;
    uint64_t end = fits[k].end;
    while (e < fits.size() && fits[e].begin < end) end = std::max(end, fits[e++].end);
    size_t best = k;
    for (size_t j = k; j < e; ++j) {
      if (fits[j].weight > fits[best].weight) best = j;
    }
    bool clear = fits_per_section[fits[best].section] == 1 && !overlaps_taken(fits[best]);
    for (size_t j = k; j < e && clear; ++j) {
      if (j != best && fits[j].weight * 2 > fits[best].weight) clear = false;
    }
    if (clear) {
      ++stats.layout_sections;
      stats.layout_functions += place(fits[best].section, fits[best].base);
    }
    k = e;
  }

  for (const auto& [addr, entry] : named) {
    std::set<std::string_view> names;
    for (uint32_t c : entry.second) names.insert(fn[c].name);
    for (std::string_view n : names) out.functions.push_back({addr, entry.first, std::string(n)});
  }
  stats.functions = named.size();
  return out;
}

std::vector<std::string> DefaultStaticArchives(std::string_view soname, const std::vector<std::string>& sonames,
                                               const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  if (std::find(sonames.begin(), sonames.end(), soname) == sonames.end()) return out;
  size_t so = soname.find(".so");
  if (so == std::string_view::npos || so == 0) return out;
  std::string file = std::string(soname.substr(0, so)) + ".a";
  for (const std::string& dir : dirs) {
    if (dir.empty() || dir.front() != '/') continue;
    std::string path = dir == "/" ? "/" + file : dir + "/" + file;
    if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(std::move(path));
  }
  return out;
}

}  // namespace tlsprof::symbols
