#include "agent/symbols/loader_image.h"

#include <elf.h>
#include <gelf.h>
#include <libelf.h>

#include <algorithm>
#include <cstring>

#include "agent/symbols/eh_frame.h"
#include "agent/symbols/x86_elf.h"

namespace tlsprof::symbols {
namespace {

// Largest loadable image read into memory. libcrypto.so.3 is 4.7 MB; a
// "library" of gigabytes is not one these readers should decode.
constexpr uint64_t kMaxImageBytes = 256ull << 20;

// The file's loadable segments, each with its kind and memory size.
Result<std::vector<LoaderImage::Segment>> ImageSegments(const guard::ElfFile& elf) {
  auto segments = ReadLoadSegments(elf, /*code_only=*/false, kMaxImageBytes);
  if (!segments) return segments.error();
  std::vector<LoaderImage::Segment> out;
  for (LoadedSegment& seg : *segments) {
    const LoaderImage::Kind kind = (seg.flags & PF_X)   ? LoaderImage::kCode
                                   : (seg.flags & PF_W) ? LoaderImage::kWritable
                                                        : LoaderImage::kReadOnly;
    out.push_back({seg.vaddr, std::move(seg.bytes), seg.memsz, kind});
  }
  return out;
}

// The pointers one dynamic relocation section fills (RELATIVE, and 64/GLOB_DAT
// to a defined .dynsym symbol: `dynsym_values`), and with `dynsym_names` the
// imports its JUMP_SLOTs call.
void ApplyRelocations(Elf_Data* d, const std::vector<uint64_t>& dynsym_values,
                      const std::vector<std::string_view>& dynsym_names, LoaderImage& image) {
  const size_t n = d->d_size / sizeof(Elf64_Rela);
  for (size_t k = 0; k < n; ++k) {
    GElf_Rela rel;
    if (gelf_getrela(d, static_cast<int>(k), &rel) == nullptr) break;
    const uint32_t type = GELF_R_TYPE(rel.r_info);
    const uint64_t sym = GELF_R_SYM(rel.r_info);
    if (type == R_X86_64_RELATIVE) {
      image.pointers[rel.r_offset] = static_cast<uint64_t>(rel.r_addend);
    } else if ((type == R_X86_64_64 || type == R_X86_64_GLOB_DAT) && sym < dynsym_values.size() &&
               dynsym_values[sym] != 0) {
      image.pointers[rel.r_offset] = dynsym_values[sym] + static_cast<uint64_t>(rel.r_addend);
    } else if (type == R_X86_64_JUMP_SLOT && sym < dynsym_names.size() && !dynsym_names[sym].empty()) {
      image.plt_slots.emplace(rel.r_offset, std::string(dynsym_names[sym]));
    }
  }
}

}  // namespace

const LoaderImage::Segment* LoaderImage::SegmentAt(uint64_t vaddr) const {
  for (const Segment& s : segments) {
    if (vaddr >= s.vaddr && vaddr - s.vaddr < s.bytes.size()) return &s;
  }
  return nullptr;
}

LoaderImage::Kind LoaderImage::KindAt(uint64_t vaddr) const {
  const Segment* s = SegmentAt(vaddr);
  return s == nullptr ? kNone : s->kind;
}

LoaderImage::Kind LoaderImage::MemoryKindAt(uint64_t vaddr) const {
  for (const Segment& s : segments) {
    if (vaddr >= s.vaddr && vaddr - s.vaddr < std::max<uint64_t>(s.memsz, s.bytes.size())) return s.kind;
  }
  return kNone;
}

std::optional<uint64_t> LoaderImage::Read(uint64_t vaddr, size_t len) const {
  const Segment* s = SegmentAt(vaddr);
  if (len > 8 || s == nullptr || vaddr - s->vaddr > s->bytes.size() || s->bytes.size() - (vaddr - s->vaddr) < len) {
    return std::nullopt;
  }
  uint64_t v = 0;
  std::memcpy(&v, s->bytes.data() + (vaddr - s->vaddr), len);
  return v;
}

std::pair<const uint8_t*, size_t> LoaderImage::Bytes(uint64_t vaddr, size_t max) const {
  const Segment* s = SegmentAt(vaddr);
  if (s == nullptr) return {nullptr, 0};
  const uint64_t off = vaddr - s->vaddr;
  return {s->bytes.data() + off, static_cast<size_t>(std::min<uint64_t>(max, s->bytes.size() - off))};
}

std::optional<std::string_view> LoaderImage::String(uint64_t vaddr) const {
  const Segment* s = SegmentAt(vaddr);
  if (s == nullptr || s->kind == kWritable || vaddr - s->vaddr >= s->bytes.size()) return std::nullopt;
  const auto* begin = reinterpret_cast<const char*>(s->bytes.data() + (vaddr - s->vaddr));
  const size_t room = std::min<size_t>(s->bytes.size() - (vaddr - s->vaddr), 1024);
  size_t n = 0;
  while (n < room && begin[n] != '\0') {
    if (begin[n] < 0x20 || begin[n] > 0x7e) return std::nullopt;
    ++n;
  }
  if (n == 0 || n == room) return std::nullopt;
  return std::string_view(begin, n);
}

std::optional<uint64_t> LoaderImage::FunctionSize(uint64_t vaddr) const {
  auto it = std::lower_bound(fdes.begin(), fdes.end(), std::make_pair(vaddr, uint64_t{0}));
  if (it == fdes.end() || it->first != vaddr || it->second == 0) return std::nullopt;
  return it->second;
}

Result<LoaderImage> LoadLoaderImage(const guard::ElfFile& elf, const LoaderImageOptions& options) {
  if (auto st = CheckX86(elf); !st) return st.error();
  LoaderImage image;
  auto segments = ImageSegments(elf);
  if (!segments) return segments.error();
  image.segments = std::move(*segments);

  // Sections: .dynsym (for R_X86_64_64 targets, and the export names), the
  // dynamic relocations against it, and .eh_frame (function extents).
  std::vector<const guard::ElfSection*> relas;
  std::vector<uint64_t> dynsym_values;  // st_value of defined symbols, 0 for undefined
  std::vector<std::string_view> dynsym_names;
  size_t dynsym_index = 0;
  for (const guard::ElfSection& sec : elf.sections()) {
    const GElf_Shdr& sh = sec.shdr;
    if (sec.index == 0 || sh.sh_type == SHT_NOBITS || sh.sh_size == 0) continue;
    if (sh.sh_type == SHT_DYNSYM) {
      auto bytes = elf.SectionBytes(sec);
      if (!bytes) return bytes.error();
      Elf_Data* d = elf.data(sec);
      if (d == nullptr) continue;
      dynsym_index = sec.index;
      const size_t n = d->d_size / sizeof(Elf64_Sym);
      dynsym_values.assign(n, 0);
      if (options.symbol_names) dynsym_names.assign(n, {});
      for (size_t k = 1; k < n; ++k) {
        GElf_Sym sym;
        if (gelf_getsym(d, static_cast<int>(k), &sym) == nullptr) break;
        if (sym.st_shndx != SHN_UNDEF) dynsym_values[k] = sym.st_value;
        if (options.symbol_names) {
          auto s = elf.StringAt(sh.sh_link, sym.st_name);
          if (s) dynsym_names[k] = *s;
          if (s && !s->empty() && sym.st_shndx != SHN_UNDEF) image.exports.emplace(std::string(*s), sym.st_value);
        }
      }
    } else if (sh.sh_type == SHT_RELA) {
      relas.push_back(&sec);
    } else if (sh.sh_type == SHT_PROGBITS && sec.name == ".eh_frame") {
      auto bytes = elf.SectionBytes(sec);
      if (!bytes) return bytes.error();
      Elf_Data* d = elf.data(sec);
      uint64_t errors = 0;  // an undecodable FDE just gives no extent
      if (d != nullptr) {
        eh::ForEachFde(elf.elf(), d, /*eh_frame=*/true, sh.sh_addr, &errors,
                       [&image](uint64_t start, uint64_t len) { image.fdes.emplace_back(start, len); });
      }
    }
  }
  std::sort(image.fdes.begin(), image.fdes.end());
  for (const guard::ElfSection* r : relas) {
    // Only the dynamic relocations (.rela.dyn, linked to .dynsym, or with no
    // symbols at all); .rela.plt holds JUMP_SLOTs, which are not data but say
    // what a PLT stub calls.
    if (r->shdr.sh_link != dynsym_index && r->shdr.sh_link != 0) continue;
    auto bytes = elf.SectionBytes(*r);
    if (!bytes) return bytes.error();
    if (Elf_Data* d = elf.data(*r)) ApplyRelocations(d, dynsym_values, dynsym_names, image);
  }
  return image;
}

}  // namespace tlsprof::symbols
