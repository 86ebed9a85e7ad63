#include "agent/symbols/archive_match.h"

#include "agent/symbols/eh_frame.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <gelf.h>
#include <libelf.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "agent/symbols/x86_elf.h"
#include "common/hash.h"

namespace tlsprof::symbols {
namespace {

// ---------------------------------------------------------------------------
// Hashing

uint64_t Mix(uint64_t h) { return Fmix64(h); }

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

// One member of an ar archive: where its bytes are and its header's name.
struct ArMember {
  std::string name;  // the header's name field, trimmed ("/123" for a long name)
  uint64_t offset = 0, size = 0;
};

// Walks the ar member headers ("!<arch>\n", then 60-byte headers each
// followed by the member, padded to an even size) and checks that they tile
// the file exactly: a truncated archive must not look like a smaller, valid
// one. The members are read here, with pread, not by libelf: libelf would
// parse each member's ELF headers before they could be checked.
Result<std::vector<ArMember>> ReadArMembers(const guard::GuardedFile& file, std::string_view path) {
  const uint64_t file_size = file.size();
  char magic[8];
  if (file_size < 8 || !file.ReadExact(0, {reinterpret_cast<uint8_t*>(magic), 8})) {
    return MakeError("{}: too short for an ar archive", path);
  }
  if (std::memcmp(magic, "!<thin>\n", 8) == 0) return MakeError("{}: thin archives are not supported", path);
  if (std::memcmp(magic, "!<arch>\n", 8) != 0) return MakeError("{}: not an ar archive", path);
  std::vector<ArMember> members;
  uint64_t pos = 8;
  while (pos < file_size) {
    const size_t index = members.size();
    char hdr[60];
    if (file_size - pos < sizeof hdr || !file.ReadExact(pos, {reinterpret_cast<uint8_t*>(hdr), sizeof hdr})) {
      return MakeError("{}: member header {} at offset {:#x} is cut off; the archive is truncated", path, index, pos);
    }
    if (hdr[58] != '`' || hdr[59] != '\n') {
      return MakeError("{}: member header {} at offset {:#x} is corrupt", path, index, pos);
    }
    uint64_t size = 0;
    int digits = 0;
    for (int k = 48; k < 58 && hdr[k] != ' '; ++k, ++digits) {
      if (hdr[k] < '0' || hdr[k] > '9') {
        return MakeError("{}: member header {} at offset {:#x} has a bad size field", path, index, pos);
      }
      size = size * 10 + static_cast<uint64_t>(hdr[k] - '0');
    }
    if (digits == 0) return MakeError("{}: member header {} at offset {:#x} has no size", path, index, pos);
    pos += sizeof hdr;
    if (file_size - pos < size) {
      return MakeError(
          "{}: member {} ({} bytes at offset {:#x}) runs past the end of the file ({} bytes); "
          "the archive is truncated",
          path, index, size, pos, file_size);
    }
    std::string_view name(hdr, 16);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name.ends_with('/') && name.size() > 1 && name != "//") name.remove_suffix(1);  // GNU: "name/"
    members.push_back({std::string(name), pos, size});
    pos += size;
    if ((size & 1) && pos < file_size) ++pos;  // padding (may be missing at the very end)
  }
  if (members.empty()) return MakeError("{}: empty archive", path);
  return members;
}

// An archive member's sections (guard::ElfFile checked that they lie
// inside the member).
struct MemberSections {
  const guard::ElfFile& elf;

  size_t count() const { return elf.sections().size(); }
  const GElf_Shdr& shdr(size_t i) const { return elf.sections()[i].shdr; }

  // Executable PROGBITS: where functions are.
  bool IsCode(size_t i) const {
    return i < count() && (shdr(i).sh_flags & SHF_EXECINSTR) && shdr(i).sh_type == SHT_PROGBITS;
  }

  // The section's bytes (empty for NOBITS and empty sections).
  Result<std::span<const uint8_t>> Bytes(size_t i) const { return elf.SectionBytes(elf.sections()[i]); }
  Elf_Data* Data(size_t i) const { return elf.data(elf.sections()[i]); }

  // The first .symtab; 0: none.
  size_t Symtab() const {
    for (size_t i = 1; i < count(); ++i) {
      if (shdr(i).sh_type == SHT_SYMTAB) return i;
    }
    return 0;
  }
};

// Code section -> its relocations (offset, type), sorted.
using CodeRelocs = std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>>;

Result<CodeRelocs> ReadCodeRelocs(const MemberSections& sections) {
  CodeRelocs relocs;
  for (size_t i = 1; i < sections.count(); ++i) {
    const GElf_Shdr& sh = sections.shdr(i);
    if (sh.sh_type != SHT_RELA && sh.sh_type != SHT_REL) continue;
    if (!sections.IsCode(sh.sh_info)) continue;
    if (sh.sh_type == SHT_REL) return MakeError("SHT_REL relocations (not x86-64 RELA)");
    auto b = sections.Bytes(i);
    if (!b) return b.error();
    Elf_Data* d = b->empty() ? nullptr : sections.Data(i);
    auto& v = relocs[sh.sh_info];
    const size_t n = b->size() / sizeof(Elf64_Rela);
    for (size_t k = 0; k < n; ++k) {
      GElf_Rela r;
      if (gelf_getrela(d, static_cast<int>(k), &r) == nullptr) return MakeError("bad relocation {}", k);
      v.emplace_back(r.r_offset, static_cast<uint32_t>(GELF_R_TYPE(r.r_info)));
    }
    std::sort(v.begin(), v.end());
  }
  return relocs;
}

// Whether symbol `sym` may name a function: named, sized, defined in a code
// section, and of a function's type (or none: assembly).
bool IsCodeSymbol(const MemberSections& sections, const GElf_Sym& sym) {
  const int type = GELF_ST_TYPE(sym.st_info);
  const size_t shndx = sym.st_shndx;
  if (sym.st_name == 0 || sym.st_size == 0 || shndx == SHN_UNDEF || shndx >= SHN_LORESERVE) return false;
  if (!sections.IsCode(shndx)) return false;
  return type == STT_FUNC || type == STT_GNU_IFUNC || type == STT_NOTYPE;
}

// Symbol `k`'s name in `strtab`; an error where it lies outside or runs off
// its end.
Result<std::string_view> SymbolName(std::span<const uint8_t> strtab, const GElf_Sym& sym, size_t k) {
  if (sym.st_name >= strtab.size()) return MakeError("symbol {} has a name outside .strtab", k);
  const char* nb = reinterpret_cast<const char*>(strtab.data()) + sym.st_name;
  const void* nul = std::memchr(nb, '\0', strtab.size() - sym.st_name);
  if (nul == nullptr) return MakeError("symbol {} has an unterminated name", k);
  return std::string_view(nb, static_cast<const char*>(nul) - nb);
}

// Sorts `ranges` and merges those that touch or overlap.
std::vector<ByteRange> MergeRanges(std::vector<ByteRange>& ranges) {
  std::sort(ranges.begin(), ranges.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
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
  ArchiveIndexBuilder(const guard::GuardedFile& file, std::string path)
      : file_(file), index_(std::make_shared<ArchiveIndex>()) {
    index_->path_ = std::move(path);
  }

  Result<std::shared_ptr<const ArchiveIndex>> Build() {
    if (!InitLibelf()) return MakeError("libelf is too old (elf_version failed)");
    const std::string& path = index_->path_;
    auto members = ReadArMembers(file_, path);
    if (!members) return members.error();
    for (const ArMember& m : *members) {
      uint8_t magic[SELFMAG] = {};
      if (m.size < sizeof(Elf64_Ehdr) || !file_.ReadExact(m.offset, magic) ||
          std::memcmp(magic, ELFMAG, SELFMAG) != 0) {
        continue;  // the symbol index, long names, or not ELF
      }
      // An object file is read whole (they are kilobytes) and parsed in
      // memory, where libelf checks every offset against it.
      auto bytes = file_.ReadRange(m.offset, m.size, guard::kMaxSectionBytes, "an archive member");
      if (!bytes) return MakeError("{}: member {}: {}", path, m.name, bytes.error().message);
      auto elf = guard::ElfFile::OpenMemory(std::move(*bytes), fmt::format("{}({})", path, m.name));
      if (!elf) return MakeError("{}: member {}: {}", path, m.name, elf.error().message);
      auto st = AddMember(*elf);
      if (!st) return MakeError("{}: member {}: {}", path, m.name, st.error().message);
      ++index_->members_;
    }
    if (index_->functions_.empty()) return MakeError("{}: no ELF x86-64 functions in the archive", path);
    Finish();
    return std::shared_ptr<const ArchiveIndex>(std::move(index_));
  }

 private:
  // Per member: its code sections' bytes (read on demand), their section
  // ids in the index, and the body id of each (section, offset, size).
  struct Member {
    const MemberSections& sections;
    const CodeRelocs& relocs;
    std::map<size_t, std::span<const uint8_t>> code;
    std::map<size_t, uint32_t> section_ids;
    std::map<std::tuple<size_t, uint64_t, uint64_t>, uint32_t> bodies;
  };

  // Indexes the functions of an x86-64 relocatable member; other members
  // are ignored.
  Status AddMember(const guard::ElfFile& elf) {
    if (elf.ehdr().e_type != ET_REL || !elf.x86_64()) return OkStatus();  // not understood here: ignored
    const MemberSections sections{elf};
    const size_t symtab = sections.Symtab();
    if (symtab == 0) return OkStatus();  // nothing named
    auto relocs = ReadCodeRelocs(sections);
    if (!relocs) return relocs.error();
    return AddFunctions(sections, symtab, *relocs);
  }

  // Every function symbol of the member's .symtab.
  Status AddFunctions(const MemberSections& sections, size_t symtab, const CodeRelocs& relocs) {
    const GElf_Shdr& symhdr = sections.shdr(symtab);
    if (symhdr.sh_link == 0 || symhdr.sh_link >= sections.count() ||
        sections.shdr(symhdr.sh_link).sh_type != SHT_STRTAB) {
      return MakeError(".symtab links to section {}, which is not a string table", symhdr.sh_link);
    }
    auto strtab = sections.Bytes(symhdr.sh_link);
    if (!strtab) return strtab.error();
    auto syms = sections.Bytes(symtab);
    if (!syms) return syms.error();
    Elf_Data* symdata = syms->empty() ? nullptr : sections.Data(symtab);
    const size_t nsyms = syms->size() / sizeof(Elf64_Sym);
    if (nsyms > guard::kMaxSymbols) {
      guard::Refuse(guard::Reason::kSymbols, index_->path_, fmt::format("a member with {} symbols", nsyms));
      return MakeError("{} symbols, over the cap of {}", nsyms, guard::kMaxSymbols);
    }
    Member member{sections, relocs, {}, {}, {}};
    for (size_t k = 1; k < nsyms; ++k) {
      GElf_Sym sym;
      if (gelf_getsym(symdata, static_cast<int>(k), &sym) == nullptr) return MakeError("bad symbol {}", k);
      if (!IsCodeSymbol(sections, sym)) continue;
      auto name = SymbolName(*strtab, sym, k);
      if (!name) return name.error();
      if (name->empty()) continue;
      if (auto st = AddFunction(member, sym, *name); !st) return st;
    }
    return OkStatus();
  }

  // One function: its bytes hashed around what relocations may change.
  Status AddFunction(Member& member, const GElf_Sym& sym, std::string_view name) {
    const size_t shndx = sym.st_shndx;
    auto it = member.code.find(shndx);
    if (it == member.code.end()) {
      auto b = member.sections.Bytes(shndx);
      if (!b) return b.error();
      it = member.code.emplace(shndx, *b).first;
    }
    std::span<const uint8_t> sec = it->second;
    if (sym.st_value > sec.size() || sec.size() - sym.st_value < sym.st_size) {
      ++skipped_;  // a size past its section: not trusted, not fatal
      return OkStatus();
    }
    if (sym.st_size > (1u << 28)) return OkStatus();
    std::span<const uint8_t> body = sec.subspan(sym.st_value, sym.st_size);
    const std::vector<ByteRange> merged = RelocMask(member.relocs, shndx, sym.st_value, sym.st_size);
    uint32_t masked = 0;
    for (const ByteRange& r : merged) masked += r.end - r.begin;

    ArchiveFunction f;
    f.name = std::string(name);
    f.size = sym.st_size;
    f.offset = sym.st_value;
    f.mask = InternMask(merged);
    f.hash = ArchiveIndex::MaskedHash(body, merged);
    f.unmasked = static_cast<uint32_t>(sym.st_size - masked);
    f.global = GELF_ST_BIND(sym.st_info) != STB_LOCAL;
    auto sid = member.section_ids.find(shndx);
    if (sid == member.section_ids.end()) {
      sid = member.section_ids.emplace(shndx, static_cast<uint32_t>(index_->section_members_.size())).first;
      index_->section_members_.push_back(static_cast<uint32_t>(index_->members_));
    }
    f.section = sid->second;
    auto [b, inserted] =
        member.bodies.emplace(std::make_tuple(shndx, sym.st_value, sym.st_size), static_cast<uint32_t>(next_body_));
    if (inserted) ++next_body_;
    f.body = b->second;
    index_->functions_.push_back(std::move(f));
    return OkStatus();
  }

  // The bytes of the function at [value, value + size) of code section
  // `shndx` that its relocations may change: sorted, merged ranges.
  std::vector<ByteRange> RelocMask(const CodeRelocs& relocs, size_t shndx, uint64_t value, uint64_t size) {
    scratch_.clear();
    if (auto r = relocs.find(shndx); r != relocs.end()) {
      auto lo = std::lower_bound(r->second.begin(), r->second.end(), std::make_pair(value, uint32_t{0}));
      for (; lo != r->second.end() && lo->first < value + size; ++lo) {
        ByteRange br = RelocRange(lo->second, lo->first - value);
        br.end = std::min<uint32_t>(br.end, static_cast<uint32_t>(size));
        if (br.begin < br.end) scratch_.push_back(br);
      }
    }
    return MergeRanges(scratch_);
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

  const guard::GuardedFile& file_;
  std::shared_ptr<ArchiveIndex> index_;
  std::unordered_map<std::string, uint32_t> masks_;
  std::vector<ByteRange> scratch_;
  size_t next_body_ = 0;
  size_t skipped_ = 0;
};

Result<std::shared_ptr<const ArchiveIndex>> ArchiveIndex::Load(const guard::GuardedFile& file) {
  return ArchiveIndexBuilder(file, file.name()).Build();
}

Result<std::shared_ptr<const ArchiveIndex>> GetArchiveIndex(const guard::GuardedFile& file) {
  const std::string key =
      fmt::format("{}:{}:{}:{}:{}", file.id().dev, file.id().ino, file.size(), file.mtime_ns(), file.ctime_ns());
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const ArchiveIndex>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto index = ArchiveIndex::Load(file);
  if (!index) return index.error();
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, std::move(*index)).first->second;
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

Result<SoView> ReadSo(const guard::ElfFile& elf) {
  if (auto st = CheckX86(elf); !st) return st.error();
  SoView so;
  auto code = ReadLoadSegments(elf, /*code_only=*/true, guard::kMaxSectionBytes);
  if (!code) return code.error();
  for (LoadedSegment& seg : *code) so.code.segments.push_back({seg.vaddr, std::move(seg.bytes)});
  for (const guard::ElfSection& sec : elf.sections()) {
    const GElf_Shdr& sh = sec.shdr;
    if (sec.index == 0 || sh.sh_type == SHT_NOBITS || sh.sh_size == 0) continue;
    if (sh.sh_type == SHT_PROGBITS && sec.name == ".eh_frame") {
      auto bytes = elf.SectionBytes(sec);
      if (!bytes) return bytes.error();
      if (Elf_Data* d = elf.data(sec)) so.fdes = EhFrameRanges(elf.elf(), d, sh.sh_addr);
    } else if (sh.sh_type == SHT_DYNSYM) {
      auto bytes = elf.SectionBytes(sec);
      if (!bytes) return bytes.error();
      Elf_Data* d = elf.data(sec);
      if (d == nullptr) continue;
      const size_t n = d->d_size / sizeof(Elf64_Sym);
      for (size_t k = 1; k < n; ++k) {
        GElf_Sym sym;
        if (gelf_getsym(d, static_cast<int>(k), &sym) == nullptr) break;
        if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_size == 0) continue;
        auto sn = elf.StringAt(sh.sh_link, sym.st_name);
        if (!sn || sn->empty()) continue;
        so.exports.push_back({sym.st_value, sym.st_size, std::string(*sn)});
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

// A section's functions all matching at one base: the bytes they cover and
// the unmasked bytes that matched.
struct Fit {
  uint64_t begin = 0, end = 0, weight = 0;
  uint32_t section = 0;
  uint64_t base = 0;
};

// One MatchArchive run over a .so and an archive's index. The steps run in
// order, each using what the ones before learned: anchor votes (section ->
// base -> votes), the addresses named so far, the FDE ranges that stayed
// ambiguous and the ranges of placed sections.
class Matcher {
 public:
  Matcher(const SoView& so, const ArchiveIndex& index, const ArchiveMatchOptions& options, ArchiveMatchStats& stats)
      : so_(so), index_(index), fn_(index.functions()), options_(options), stats_(stats) {}

  // 1. Is the archive from this build? Its globals must cover enough of the
  // exports, and enough of those must match. Matching exports vote for their
  // section's base when options.anchor_on_exports.
  Status CheckExports(std::string_view so_path) {
    for (const Export& e : so_.exports) {
      ++stats_.exports;
      std::span<const uint32_t> globals = index_.GlobalsNamed(e.name);
      if (globals.empty()) continue;
      ++stats_.exports_checked;
      std::span<const uint8_t> bytes = so_.code.Read(e.addr, e.size);
      for (uint32_t g : globals) {
        if (Matches(index_, fn_[g], bytes)) {
          ++stats_.exports_matched;
          if (options_.anchor_on_exports) ++votes_[fn_[g].section][e.addr - fn_[g].offset];
          break;
        }
      }
    }
    if (stats_.exports_checked == 0 || static_cast<double>(stats_.exports_checked) <
                                           options_.min_export_coverage * static_cast<double>(stats_.exports)) {
      return MakeError("{}: archive {} defines {} of the library's {} exported functions; not its static counterpart",
                       so_path, index_.path(), stats_.exports_checked, stats_.exports);
    }
    if (static_cast<double>(stats_.exports_matched) <
        options_.min_export_match * static_cast<double>(stats_.exports_checked)) {
      return MakeError("{}: only {} of {} exported functions match their code in {}; the archive is from another build",
                       so_path, stats_.exports_matched, stats_.exports_checked, index_.path());
    }
    return OkStatus();
  }

  // 2. FDE ranges: each is named where its candidates agree.
  void MatchFdes() {
    for (const Range& r : so_.fdes) MatchFde(r);
  }

  // 3. Anchored sections: a section whose votes agree on one base is placed
  // there.
  void PlaceAnchoredSections() {
    for (const auto& [section, bases] : votes_) {
      if (bases.size() != 1) {
        ++stats_.conflicting_sections;
        continue;
      }
      ++stats_.anchored_sections;
      const uint64_t base = bases.begin()->first;
      stats_.anchored_functions += Place(section, base);
      uint64_t b = UINT64_MAX, e = 0;
      for (uint32_t c : index_.InSection(section)) {
        b = std::min(b, base + fn_[c].offset);
        e = std::max(e, base + fn_[c].offset + fn_[c].size);
      }
      if (b < e) taken_.emplace_back(b, e);
    }
  }

  // 3b. Sections without an anchor whose whole layout fits where an
  // ambiguous range points (a file of macro-generated wrappers that are
  // identical one by one, but not as a sequence). A fit overlapping a placed
  // section, another fit of a similar weight, or the same section elsewhere
  // is not used.
  void PlaceByLayout() {
    std::map<uint32_t, int> fits_per_section;
    std::vector<Fit> fits = LayoutFits(fits_per_section);
    std::sort(taken_.begin(), taken_.end());
    std::sort(fits.begin(), fits.end(), [](const Fit& a, const Fit& b) { return a.begin < b.begin; });
    for (size_t k = 0; k < fits.size();) {
      // A cluster of overlapping fits, and its heaviest.
      size_t e = k + 1;
      uint64_t end = fits[k].end;
      while (e < fits.size() && fits[e].begin < end) end = std::max(end, fits[e++].end);
      size_t best = k;
      for (size_t j = k; j < e; ++j) {
        if (fits[j].weight > fits[best].weight) best = j;
      }
      bool clear = fits_per_section[fits[best].section] == 1 && !OverlapsTaken(fits[best]);
      for (size_t j = k; j < e && clear; ++j) {
        if (j != best && fits[j].weight * 2 > fits[best].weight) clear = false;
      }
      if (clear) {
        ++stats_.layout_sections;
        stats_.layout_functions += Place(fits[best].section, fits[best].base);
      }
      k = e;
    }
  }

  // Every name of every named address, by address.
  std::vector<MatchedFunction> Named() {
    std::vector<MatchedFunction> out;
    for (const auto& [addr, entry] : named_) {
      std::set<std::string_view> names;
      for (uint32_t c : entry.second) names.insert(fn_[c].name);
      for (std::string_view n : names) out.push_back({addr, entry.first, std::string(n)});
    }
    stats_.functions = named_.size();
    return out;
  }

 private:
  // Calls hit(c) for each candidate of `cands` whose masked hash is that of
  // `bytes`. Candidates of one size sharing a mask are adjacent
  // (ArchiveIndex::WithSize), so the bytes hash once per run of them.
  template <typename Hit>
  void ForEachHashMatch(std::span<const uint8_t> bytes, std::span<const uint32_t> cands, Hit&& hit) const {
    uint32_t last_mask = UINT32_MAX;
    uint64_t h = 0;
    for (uint32_t c : cands) {
      if (fn_[c].mask != last_mask) {
        last_mask = fn_[c].mask;
        h = ArchiveIndex::MaskedHash(bytes, index_.mask(last_mask));
      }
      if (h == fn_[c].hash) hit(c);
    }
  }

  // Names range `r` where its matches are one body (aliases: they also vote
  // for their section's base) or one name, with enough unmasked bytes;
  // keeps it as ambiguous where they are neither.
  void MatchFde(const Range& r) {
    std::span<const uint8_t> bytes = so_.code.Read(r.start, r.len);
    if (bytes.empty()) return;
    ++stats_.fde_ranges;
    std::span<const uint32_t> cands = index_.WithSize(r.len);
    if (cands.empty()) {
      ++stats_.fde_no_candidate;
      return;
    }
    hits_.clear();
    ForEachHashMatch(bytes, cands, [this](uint32_t c) { hits_.push_back(c); });
    if (hits_.empty()) {
      ++stats_.fde_no_match;
      return;
    }
    const ArchiveFunction& first = fn_[hits_[0]];
    bool one_body = std::all_of(hits_.begin(), hits_.end(), [&](uint32_t c) { return fn_[c].body == first.body; });
    bool one_name = std::all_of(hits_.begin(), hits_.end(), [&](uint32_t c) { return fn_[c].name == first.name; });
    if (!one_body && !one_name) {
      ++stats_.fde_ambiguous;
      ambiguous_.push_back(r);
      return;
    }
    uint32_t unmasked = UINT32_MAX;
    for (uint32_t c : hits_) unmasked = std::min(unmasked, fn_[c].unmasked);
    if (unmasked < options_.min_unique_bytes) {
      ++stats_.fde_too_small;
      return;
    }
    ++stats_.fde_unique;
    if (one_body) {
      ++votes_[first.section][r.start - first.offset];
      named_[r.start] = {r.len, hits_};
    } else {
      named_[r.start] = {r.len, {hits_[0]}};
    }
  }

  // Checks every function of `section` at `base`; nullopt if one differs.
  std::optional<Fit> FitAt(uint32_t section, uint64_t base) const {
    Fit f{UINT64_MAX, 0, 0, section, base};
    for (uint32_t c : index_.InSection(section)) {
      const ArchiveFunction& a = fn_[c];
      if (!Matches(index_, a, so_.code.Read(base + a.offset, a.size))) return std::nullopt;
      f.begin = std::min(f.begin, base + a.offset);
      f.end = std::max(f.end, base + a.offset + a.size);
      f.weight += a.unmasked;
    }
    return f;
  }

  // Names the functions of `section` that match at `base`; returns how many
  // addresses were new.
  uint64_t Place(uint32_t section, uint64_t base) {
    uint64_t added = 0;
    std::span<const uint32_t> members = index_.InSection(section);
    for (size_t k = 0; k < members.size();) {
      // Aliases (one body) are adjacent: same offset.
      size_t e = k + 1;
      while (e < members.size() && fn_[members[e]].body == fn_[members[k]].body) ++e;
      const ArchiveFunction& f = fn_[members[k]];
      const uint64_t addr = base + f.offset;
      std::span<const uint8_t> bytes = so_.code.Read(addr, f.size);
      if (!bytes.empty() && Matches(index_, f, bytes) && !named_.contains(addr)) {
        named_[addr] = {f.size, std::vector<uint32_t>(members.begin() + k, members.begin() + e)};
        ++added;
      }
      k = e;
    }
    return added;
  }

  // Candidates: (section, base) pairs that at least two ambiguous ranges
  // point to, for sections without anchors (a section of one function
  // cannot be told from its twins by layout), whose whole layout fits with
  // at least options.min_layout_bytes. Counts the fits of each section.
  std::vector<Fit> LayoutFits(std::map<uint32_t, int>& fits_per_section) const {
    std::vector<std::pair<uint32_t, uint64_t>> candidates;
    for (const Range& r : ambiguous_) {
      ForEachHashMatch(so_.code.Read(r.start, r.len), index_.WithSize(r.len), [&](uint32_t c) {
        if (!votes_.contains(fn_[c].section)) candidates.emplace_back(fn_[c].section, r.start - fn_[c].offset);
      });
    }
    std::sort(candidates.begin(), candidates.end());
    std::vector<Fit> fits;
    for (size_t k = 0; k < candidates.size();) {
      size_t e = k + 1;
      while (e < candidates.size() && candidates[e] == candidates[k]) ++e;
      const auto [section, base] = candidates[k];
      const bool supported = e - k >= 2;
      k = e;
      if (!supported) continue;
      std::optional<Fit> f = FitAt(section, base);
      if (!f || f->weight < options_.min_layout_bytes) continue;
      fits.push_back(*f);
      ++fits_per_section[section];
    }
    return fits;
  }

  // Whether `f` overlaps a section placed by its anchors (taken_ sorted).
  bool OverlapsTaken(const Fit& f) const {
    auto it = std::lower_bound(taken_.begin(), taken_.end(), std::make_pair(f.end, uint64_t{0}));
    return it != taken_.begin() && std::prev(it)->second > f.begin;
  }

  const SoView& so_;
  const ArchiveIndex& index_;
  const std::vector<ArchiveFunction>& fn_;
  const ArchiveMatchOptions& options_;
  ArchiveMatchStats& stats_;
  std::map<uint32_t, std::map<uint64_t, uint32_t>> votes_;
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint32_t>>> named_;  // addr -> (size, function indices)
  std::vector<Range> ambiguous_;
  std::vector<std::pair<uint64_t, uint64_t>> taken_;  // [begin, end) of placed sections
  std::vector<uint32_t> hits_;                        // MatchFde's, kept for its capacity
};

}  // namespace

Result<ArchiveMatch> MatchArchive(const guard::ElfFile& so, const ArchiveIndex& index,
                                  const ArchiveMatchOptions& options) {
  auto read = ReadSo(so);
  if (!read) return read.error();
  ArchiveMatch out;
  Matcher matcher(*read, index, options, out.stats);
  if (auto st = matcher.CheckExports(so.path()); !st) return st.error();
  matcher.MatchFdes();
  matcher.PlaceAnchoredSections();
  matcher.PlaceByLayout();
  out.functions = matcher.Named();
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
