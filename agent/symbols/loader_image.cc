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

// A relocation section and its header.
struct Rela {
  Elf_Scn* scn;
  GElf_Shdr sh;
};

// The file's loadable segments, each with its kind and memory size.
Result<std::vector<LoaderImage::Segment>> ImageSegments(int fd, const X86Elf& file, std::string_view path) {
  auto segments = ReadLoadSegments(fd, file, path, /*code_only=*/false, kMaxImageBytes);
  if (!segments) return segments.error();
  size_t phnum = 0;
  std::vector<uint64_t> memsz;  // p_memsz of the segments ReadLoadSegments returned, in order
  if (elf_getphdrnum(file.elf.get(), &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(file.elf.get(), static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD &&
          ph.p_filesz != 0) {
        memsz.push_back(ph.p_memsz);
      }
    }
  }
  std::vector<LoaderImage::Segment> out;
  for (size_t i = 0; i < segments->size(); ++i) {
    LoadedSegment& seg = (*segments)[i];
    const LoaderImage::Kind kind = (seg.flags & PF_X)   ? LoaderImage::kCode
                                   : (seg.flags & PF_W) ? LoaderImage::kWritable
                                                        : LoaderImage::kReadOnly;
    const uint64_t size = i < memsz.size() ? memsz[i] : seg.bytes.size();
    out.push_back({seg.vaddr, std::move(seg.bytes), size, kind});
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

Result<LoaderImage> LoadLoaderImage(int fd, std::string_view path, const LoaderImageOptions& options) {
  auto opened = OpenX86Elf(fd, path);
  if (!opened) return opened.error();
  const ElfPtr& elf = opened->elf;
  const uint64_t file_size = opened->file_size;
  LoaderImage image;
  auto segments = ImageSegments(fd, *opened, path);
  if (!segments) return segments.error();
  image.segments = std::move(*segments);

  // Sections: .dynsym (for R_X86_64_64 targets, and the export names), the
  // dynamic relocations against it, and .eh_frame (function extents).
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf.get(), &shstrndx) != 0) return MakeError("{}: no section name table", path);
  std::vector<Rela> relas;
  std::vector<uint64_t> dynsym_values;  // st_value of defined symbols, 0 for undefined
  std::vector<std::string_view> dynsym_names;
  size_t dynsym_index = 0;
  for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn != nullptr; scn = elf_nextscn(elf.get(), scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) return MakeError("{}: unreadable section header", path);
    if (sh.sh_type == SHT_NOBITS || sh.sh_size == 0) continue;
    if (sh.sh_offset > file_size || file_size - sh.sh_offset < sh.sh_size) {
      return MakeError("{}: section {} extends past the end of the file", path, elf_ndxscn(scn));
    }
    const char* name = elf_strptr(elf.get(), shstrndx, sh.sh_name);
    if (sh.sh_type == SHT_DYNSYM) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d == nullptr) continue;
      dynsym_index = elf_ndxscn(scn);
      const size_t n = d->d_size / sizeof(Elf64_Sym);
      dynsym_values.assign(n, 0);
      if (options.symbol_names) dynsym_names.assign(n, {});
      for (size_t k = 1; k < n; ++k) {
        GElf_Sym sym;
        if (gelf_getsym(d, static_cast<int>(k), &sym) == nullptr) break;
        if (sym.st_shndx != SHN_UNDEF) dynsym_values[k] = sym.st_value;
        if (options.symbol_names) {
          const char* s = elf_strptr(elf.get(), sh.sh_link, sym.st_name);
          if (s != nullptr) dynsym_names[k] = s;
          if (s != nullptr && *s != '\0' && sym.st_shndx != SHN_UNDEF) image.exports.emplace(s, sym.st_value);
        }
      }
    } else if (sh.sh_type == SHT_RELA) {
      relas.push_back({scn, sh});
    } else if (sh.sh_type == SHT_PROGBITS && name != nullptr && std::strcmp(name, ".eh_frame") == 0) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      uint64_t errors = 0;  // an undecodable FDE just gives no extent
      if (d != nullptr) {
        eh::ForEachFde(elf.get(), d, /*eh_frame=*/true, sh.sh_addr, &errors,
                       [&image](uint64_t start, uint64_t len) { image.fdes.emplace_back(start, len); });
      }
    }
  }
  std::sort(image.fdes.begin(), image.fdes.end());
  for (const Rela& r : relas) {
    // Only the dynamic relocations (.rela.dyn, linked to .dynsym, or with no
    // symbols at all); .rela.plt holds JUMP_SLOTs, which are not data but say
    // what a PLT stub calls.
    if (r.sh.sh_link != dynsym_index && r.sh.sh_link != 0) continue;
    if (Elf_Data* d = elf_getdata(r.scn, nullptr)) ApplyRelocations(d, dynsym_values, dynsym_names, image);
  }
  return image;
}

}  // namespace tlsprof::symbols
