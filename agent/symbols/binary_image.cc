#include "agent/symbols/binary_image.h"

#include <gelf.h>
#include <libelf.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <unordered_set>

#include "agent/guard/elf_file.h"
#include "agent/symbols/archive_match.h"
#include "agent/symbols/boringssl_tables.h"
#include "agent/symbols/debug_sources.h"
#include "agent/symbols/eh_frame.h"
#include "agent/symbols/go_pclntab.h"
#include "agent/symbols/library_tables.h"
#include "agent/symbols/object_layout.h"
#include "agent/symbols/x86_elf.h"

namespace tlsprof::symbols {

std::string_view SymbolSourceName(SymbolSource source) {
  switch (source) {
    case SymbolSource::kNone:
      return "none";
    case SymbolSource::kDynsym:
      return "dynsym";
    case SymbolSource::kSymtab:
      return "symtab";
    case SymbolSource::kGoPclntab:
      return "gopclntab";
    case SymbolSource::kDebugLink:
      return "debuglink";
    case SymbolSource::kBuildIdDebugDir:
      return "build-id-dir";
    case SymbolSource::kDebuginfod:
      return "debuginfod";
    case SymbolSource::kStaticArchive:
      return "static-archive";
    case SymbolSource::kLibraryTables:
      return "library-tables";
    case SymbolSource::kMethodTables:
      return "method-tables";
  }
  return "none";
}

bool DebugSearch::DefaultUseDebuginfod() { return DebuginfodConfigured(); }

std::optional<uint64_t> BinaryImage::FileOffsetToVaddr(uint64_t file_offset) const {
  for (const LoadSegment& s : segments) {
    if (file_offset >= s.offset && file_offset - s.offset < s.filesz) {
      return file_offset - s.offset + s.vaddr;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> BinaryImage::FunctionStartAt(uint64_t vaddr) const {
  if (function_starts.empty()) return std::nullopt;
  const int64_t rel = static_cast<int64_t>(vaddr - function_base);
  if (rel < std::numeric_limits<int32_t>::min() || rel > std::numeric_limits<int32_t>::max()) return std::nullopt;
  auto it = std::upper_bound(function_starts.begin(), function_starts.end(), static_cast<int32_t>(rel));
  if (it == function_starts.begin()) return std::nullopt;
  return function_base + static_cast<uint64_t>(static_cast<int64_t>(*(it - 1)));
}

std::optional<uint64_t> BinaryImage::MappingVaddr(uint64_t map_offset, bool executable) const {
  constexpr uint64_t kPageMask = 4096 - 1;  // x86-64; the kernel rounds by the page, not p_align
  for (const LoadSegment& s : segments) {
    if (s.executable != executable || (s.vaddr & kPageMask) > s.offset) continue;
    const uint64_t mapped_from = s.offset - (s.vaddr & kPageMask);
    if (map_offset >= mapped_from && map_offset < s.offset + s.filesz) return map_offset - s.offset + s.vaddr;
  }
  return FileOffsetToVaddr(map_offset);
}

namespace {

using guard::ElfFile;
using guard::ElfSection;

// Go's linker tags its build ID note with owner "Go" and this type
// (cmd/link/internal/ld/elf.go, ELF_NOTE_GOBUILDID_TAG).
constexpr uint32_t kGoBuildIdNoteType = 4;

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

uint32_t Word(const uint8_t* p, bool big_endian) {
  return big_endian ? (uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3])
                    : (uint32_t{p[3]} << 24 | uint32_t{p[2]} << 16 | uint32_t{p[1]} << 8 | p[0]);
}

// Scans one block of notes (names and descriptors padded to `align`: 4, or 8
// for 8-aligned note segments). Records the GNU build ID, or else the first
// Go build ID. Returns true once a GNU build ID is found (nothing better
// exists). A malformed tail ends the scan; what was found is kept.
bool ScanNotes(std::span<const uint8_t> notes, uint64_t align, bool big_endian, std::string& gnu, std::string& go) {
  auto pad = [align](uint64_t n) { return (n + align - 1) & ~(align - 1); };
  for (uint64_t off = 0; notes.size() - off >= 12;) {
    const uint64_t namesz = Word(notes.data() + off, big_endian);
    const uint64_t descsz = Word(notes.data() + off + 4, big_endian);
    const uint32_t type = Word(notes.data() + off + 8, big_endian);
    const uint64_t name_off = off + 12;
    if (notes.size() - name_off < pad(namesz)) break;
    const uint64_t desc_off = name_off + pad(namesz);
    if (notes.size() - desc_off < descsz) break;
    // Owners are NUL-padded: Go writes "Go\0\0" with n_namesz 4.
    std::string_view owner(reinterpret_cast<const char*>(notes.data() + name_off), namesz);
    owner = owner.substr(0, owner.find('\0'));
    std::span<const uint8_t> desc = notes.subspan(desc_off, descsz);
    if (owner == "GNU" && type == NT_GNU_BUILD_ID && !desc.empty()) {
      gnu = Hex(desc);
      return true;
    }
    if (owner == "Go" && type == kGoBuildIdNoteType && !desc.empty() && go.empty()) go = Hex(desc);
    if (notes.size() - desc_off < pad(descsz)) break;
    off = desc_off + pad(descsz);
  }
  return false;
}

// Build ID: NT_GNU_BUILD_ID as lowercase hex. Go binaries linked internally
// have no GNU note; they get the Go build ID note's bytes (an ASCII string
// such as "abc/def/ghi/jkl"), hex-encoded so build_id is always lowercase hex.
// Such an ID serves as a cache key but will not be known to debuginfod.
// PT_NOTE segments are read first: they survive section-header stripping and
// are what the loader maps; SHT_NOTE sections are the fallback. Each note
// block is read up to guard::kMaxNoteBytes.
struct BuildId {
  std::string hex;
  bool gnu = false;  // NT_GNU_BUILD_ID (what debug files and debuginfod are keyed by)
};

BuildId FindBuildIdNote(const ElfFile& f) {
  std::string gnu, go;
  for (const GElf_Phdr& ph : f.program_headers()) {
    if (ph.p_type != PT_NOTE || ph.p_filesz == 0 || ph.p_filesz > guard::kMaxNoteBytes) continue;
    auto notes = f.Read(ph.p_offset, ph.p_filesz, guard::kMaxNoteBytes, "a note segment");
    if (notes && ScanNotes(*notes, ph.p_align == 8 ? 8 : 4, f.big_endian(), gnu, go)) return {gnu, true};
  }
  for (const ElfSection& s : f.sections()) {
    if (s.index == 0 || s.shdr.sh_type != SHT_NOTE || s.shdr.sh_size > guard::kMaxNoteBytes) continue;
    auto notes = f.Read(s.shdr.sh_offset, s.shdr.sh_size, guard::kMaxNoteBytes, "a note section");
    if (notes && ScanNotes(*notes, s.shdr.sh_addralign == 8 ? 8 : 4, f.big_endian(), gnu, go)) return {gnu, true};
  }
  return {go, false};
}

// exec[i]: section i holds code (SHF_EXECINSTR).
std::vector<bool> ExecSections(const ElfFile& f) {
  std::vector<bool> exec(f.sections().size(), false);
  for (const ElfSection& s : f.sections()) exec[s.index] = (s.shdr.sh_flags & SHF_EXECINSTR) != 0;
  return exec;
}

// Reads the function symbols of one .symtab/.dynsym section.
//  - `exec_sections[i]` says whether section i holds code (for STT_NOTYPE);
//  - `skip_addrs` (sorted) are addresses the primary table already covers:
//    .dynsym only fills holes of .symtab/pclntab, so its versioned aliases are
//    neither counted twice nor stored twice;
//  - `addrs_out`, if set, collects every function address seen (pre-filter);
//  - `whole_objects`: options.keep_whole_objects applies (a .symtab of a
//    binary that is not Go).
// A table of more than guard::kMaxSymbols entries is refused (kSymbols).
Status ReadSymbols(const ElfFile& f, const ElfSection& sec, const std::vector<bool>& exec_sections,
                   const LoadOptions& options, const std::vector<uint64_t>* skip_addrs,
                   std::vector<uint64_t>* addrs_out, SymbolTable& out, uint64_t& seen, bool whole_objects = false) {
  const size_t sym_size = gelf_fsize(f.elf(), ELF_T_SYM, 1, EV_CURRENT);
  if (sec.shdr.sh_entsize != sym_size) {
    return MakeError("{}: {} has entry size {}, expected {}; the symbol table is corrupt", f.path(), sec.name,
                     sec.shdr.sh_entsize, sym_size);
  }
  if (sec.shdr.sh_size % sym_size != 0) {
    return MakeError("{}: {} size {} is not a multiple of its entry size {}", f.path(), sec.name, sec.shdr.sh_size,
                     sym_size);
  }
  if (sec.shdr.sh_offset > f.size() || f.size() - sec.shdr.sh_offset < sec.shdr.sh_size) {
    return MakeError("{}: {} ({} bytes at offset {:#x}) extends past the end of the file ({} bytes)", f.path(),
                     sec.name, sec.shdr.sh_size, sec.shdr.sh_offset, f.size());
  }
  if (sec.shdr.sh_size / sym_size > guard::kMaxSymbols) {
    guard::Refuse(guard::Reason::kSymbols, f.path(),
                  fmt::format("{} has {} entries, over the cap of {}", sec.name, sec.shdr.sh_size / sym_size,
                              guard::kMaxSymbols));
    return MakeError("{}: {} has {} entries, over the {} the agent reads from one table", f.path(), sec.name,
                     sec.shdr.sh_size / sym_size, guard::kMaxSymbols);
  }
  const std::vector<ElfSection>& sections = f.sections();
  if (sec.shdr.sh_link == 0 || sec.shdr.sh_link >= sections.size() ||
      sections[sec.shdr.sh_link].shdr.sh_type != SHT_STRTAB) {
    return MakeError("{}: {} links to section {}, which is not a string table", f.path(), sec.name, sec.shdr.sh_link);
  }
  const ElfSection& strsec = sections[sec.shdr.sh_link];
  auto strtab = f.SectionBytes(strsec);
  if (!strtab) return strtab.error();
  auto syms = f.SectionBytes(sec);
  if (!syms) return syms.error();
  Elf_Data* data = f.data(sec);  // libelf's, for gelf_getsym
  if (data == nullptr && !syms->empty())
    return MakeError("{}: cannot read {}: {}", f.path(), sec.name, guard::ElfErr());

  const size_t count = syms->size() / sym_size;
  const char* strings = reinterpret_cast<const char*>(strtab->data());
  whole_objects = whole_objects && options.keep && sec.shdr.sh_type == SHT_SYMTAB;
  std::vector<LinkedFunction> linked;   // every sized function, when whole_objects
  int32_t object = -1;                  // the last STT_FILE's index
  for (size_t i = 1; i < count; ++i) {  // entry 0 is the reserved null symbol
    GElf_Sym sym;
    if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) {
      return MakeError("{}: cannot read symbol {} of {}: {}", f.path(), i, sec.name, guard::ElfErr());
    }
    const int type = GELF_ST_TYPE(sym.st_info);
    if (type == STT_FILE) {
      ++object;
      continue;
    }
    if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0) continue;  // imports, unnamed
    bool is_func = type == STT_FUNC || type == STT_GNU_IFUNC;
    // Assembly often leaves code labels untyped; keep those that have a size
    // and sit in a code section.
    if (type == STT_NOTYPE && sym.st_size > 0 && sym.st_shndx < exec_sections.size() && exec_sections[sym.st_shndx]) {
      is_func = true;
    }
    if (!is_func) continue;
    if (sym.st_name >= strtab->size()) {
      return MakeError("{}: symbol {} of {} has name offset {:#x} beyond its string table {} ({} bytes)", f.path(), i,
                       sec.name, sym.st_name, strsec.name, strtab->size());
    }
    const char* name_begin = strings + sym.st_name;
    const void* nul = std::memchr(name_begin, '\0', strtab->size() - sym.st_name);
    if (nul == nullptr) {
      return MakeError("{}: symbol {} of {} has an unterminated name at offset {:#x}", f.path(), i, sec.name,
                       sym.st_name);
    }
    std::string_view name(name_begin, static_cast<const char*>(nul) - name_begin);
    if (name.empty()) continue;
    if (skip_addrs != nullptr && std::binary_search(skip_addrs->begin(), skip_addrs->end(), sym.st_value)) {
      continue;
    }
    ++seen;
    if (addrs_out != nullptr) addrs_out->push_back(sym.st_value);
    // Size 0 means unknown extent; such a symbol can never be matched, so it is
    // counted but not stored.
    if (sym.st_size == 0) continue;
    const bool kept = !options.keep || options.keep(name);
    if (whole_objects) {
      const bool local = GELF_ST_BIND(sym.st_info) == STB_LOCAL;
      linked.push_back({sym.st_value, sym.st_size, name, local && object >= 0 ? object : -1, kept});
    } else if (kept) {
      out.Add(sym.st_value, sym.st_size, name);
    }
  }
  if (whole_objects) {
    SelectWholeObjects(linked);
    for (const LinkedFunction& l : linked) {
      if (l.selected) out.Add(l.addr, l.size, l.name);
    }
  }
  return OkStatus();
}

// runtime.text for a pclntab whose textStart field is 0 in the file (PIE):
// the dynamic relocation that fills the field carries the value as its addend;
// otherwise .text starts with runtime.text when Go links internally.
uint64_t GoTextStart(const ElfFile& f, uint64_t field_vaddr) {
  for (const ElfSection& s : f.sections()) {
    if (s.index == 0 || s.shdr.sh_type != SHT_RELA) continue;
    auto bytes = f.SectionBytes(s);
    Elf_Data* data = bytes && !bytes->empty() ? f.data(s) : nullptr;
    if (data == nullptr) continue;
    const size_t rela_size = gelf_fsize(f.elf(), ELF_T_RELA, 1, EV_CURRENT);
    for (size_t i = 0; i < data->d_size / rela_size; ++i) {
      GElf_Rela rela;
      if (gelf_getrela(data, static_cast<int>(i), &rela) == nullptr) break;
      if (rela.r_offset == field_vaddr) return static_cast<uint64_t>(rela.r_addend);
    }
  }
  if (const ElfSection* text = f.Find(".text")) return text->shdr.sh_addr;
  return 0;
}

// Function symbols from Go's pclntab (a Go binary without .symtab). Looks for
// the .gopclntab section (".data.rel.ro.gopclntab" in internally linked PIEs),
// else for the table's header inside .data.rel.ro (externally linked PIEs,
// where the C linker merged it). Returns false when no pclntab was found.
Result<bool> ReadGoPclntab(const ElfFile& f, const LoadOptions& options, std::vector<uint64_t>& addrs,
                           BinaryImage& img) {
  std::span<const uint8_t> table;
  uint64_t table_vaddr = 0;
  const ElfSection* pclntab = f.Find(".gopclntab");
  if (pclntab == nullptr) pclntab = f.Find(".data.rel.ro.gopclntab");
  if (pclntab != nullptr) {
    auto bytes = f.SectionBytes(*pclntab);
    if (!bytes) return bytes.error();
    table = *bytes;
    table_vaddr = pclntab->shdr.sh_addr;
  }
  // The magic scan runs only for binaries already known to be Go (they keep
  // .go.buildinfo even when stripped), so C libraries never pay for it.
  if (table.empty() && img.is_go) {
    if (const ElfSection* relro = f.Find(".data.rel.ro")) {
      auto bytes = f.SectionBytes(*relro);
      if (!bytes) return bytes.error();
      if (auto off = FindGoPclntab(*bytes)) {
        table = bytes->subspan(*off);
        table_vaddr = relro->shdr.sh_addr + *off;
      }
    }
  }
  if (table.empty()) return false;
  auto header = ParseGoPclntabHeader(table);
  if (!header) return MakeError("{}: {}", f.path(), header.error().message);
  uint64_t text_start = header->text_start;
  if (text_start == 0 && header->version >= GoPclntabVersion::kGo118) {
    text_start = GoTextStart(f, table_vaddr + 8 + 2ull * header->ptr_size);
  }
  auto visited = ForEachGoFunction(table, text_start, [&](uint64_t entry, uint64_t end, std::string_view name) {
    ++img.symbols_seen;
    addrs.push_back(entry);
    if (end > entry && (!options.keep || options.keep(name))) img.symbols.Add(entry, end - entry, name);
  });
  if (!visited) return MakeError("{}: {}", f.path(), visited.error().message);
  img.is_go = true;
  return true;
}

// Calls to kept imports (import_calls.h). Optional information: a section
// that cannot be read is left out, never an error.
ImportCalls ReadImportCalls(const ElfFile& f, const LoadOptions& options) {
  const std::vector<ElfSection>& sections = f.sections();
  auto bytes_of = [&](const ElfSection& s) {
    auto bytes = f.SectionBytes(s);
    if (!bytes) spdlog::debug("{}", bytes.error().message);
    return bytes ? *bytes : std::span<const uint8_t>{};
  };
  std::vector<SectionView> views(sections.size());
  for (size_t i = 1; i < sections.size(); ++i) {
    const ElfSection& s = sections[i];
    SectionView& v = views[i];
    v.name = s.name;
    v.type = s.shdr.sh_type;
    v.addr = s.shdr.sh_addr;
    v.link = s.shdr.sh_link;
    v.exec = (s.shdr.sh_flags & SHF_EXECINSTR) != 0;
    const bool needed = s.shdr.sh_type == SHT_RELA || s.shdr.sh_type == SHT_DYNSYM ||
                        (s.shdr.sh_type == SHT_STRTAB && (s.shdr.sh_flags & SHF_ALLOC) != 0) ||
                        s.name.starts_with(".plt");
    if (needed) v.bytes = bytes_of(s);
  }
  return FindImportCalls(views, options.keep, [&](size_t i) { return bytes_of(sections[i]); });
}

// "/a/b/c.so" -> "/a/b"; "c.so" -> ""; "/c.so" -> "/".
std::string DirName(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return "";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

struct DebugFileRequest {
  BuildId build_id;               // of the stripped binary
  std::optional<DebugLink> link;  // its .gnu_debuglink, if any and well-formed
  std::string dir;                // its directory as its process sees it ("" if unknown)
  const ImageOrigin* origin;      // where that directory resolves
};

// A file beside the binary, inside its process's root (the tenant's), or
// under the agent's own root when the origin has none.
Result<guard::GuardedFile> OpenBeside(const DebugFileRequest& req, const std::string& path) {
  if (req.origin->root) return req.origin->root->OpenFile(path);
  return guard::OpenHostFile(path);
}

// The bytes a load reads and keeps at its peak, from the file's headers: the
// sections LoadBinaryImage may read (symbol and string tables, relocations,
// notes, the dynamic section, .eh_frame_hdr, the pclntab, the PLT) and, for a
// library that may be named from its own tables, its loadable segments.
uint64_t LoadPlanBytes(const ElfFile& f, bool tables) {
  uint64_t bytes = 0;
  for (const ElfSection& s : f.sections()) {
    const uint32_t type = s.shdr.sh_type;
    if (s.index == 0 || type == SHT_NOBITS) continue;
    if (type == SHT_SYMTAB || type == SHT_DYNSYM || type == SHT_STRTAB || type == SHT_RELA || type == SHT_NOTE ||
        type == SHT_DYNAMIC || s.name == ".eh_frame_hdr" || s.name == ".gopclntab" ||
        s.name == ".data.rel.ro.gopclntab" || s.name.starts_with(".plt") || s.name == ".gnu_debuglink") {
      bytes += s.shdr.sh_size;
    }
  }
  if (tables) {
    for (const GElf_Phdr& ph : f.program_headers()) {
      if (ph.p_type == PT_LOAD) bytes += ph.p_filesz;
    }
  }
  // What is kept is at most a symbol entry and its name per 24-byte entry.
  return bytes + bytes / 2;
}

// Reads the .symtab of one candidate debug file into `img` (collecting the
// addresses into `addrs`). Returns false, with a debug log saying why, if the
// file does not belong to the binary, is malformed, has no .symtab or the
// budget refuses it; `img` is then untouched. The cheap checks (build-id)
// come before the CRC, which reads the whole file.
bool TryDebugFile(std::string_view binary, const guard::GuardedFile& file, const DebugFileRequest& req,
                  std::optional<uint32_t> expected_crc, const LoadOptions& options, const AdmitFn& admit,
                  std::vector<uint64_t>& addrs, BinaryImage& img) {
  auto opened = ElfFile::Open(file);
  if (!opened) {
    spdlog::debug("{}: skipping debug file: {}", binary, opened.error().message);
    return false;
  }
  const ElfFile& d = *opened;
  // A binary without a GNU build-id can only be matched by the debuglink CRC.
  const BuildId debug_id = FindBuildIdNote(d);
  if (req.build_id.gnu && (!debug_id.gnu || debug_id.hex != req.build_id.hex)) {
    spdlog::debug("{}: skipping debug file {}: its build-id {} does not match the binary's {}", binary, file.name(),
                  debug_id.hex.empty() ? "(none)" : debug_id.hex, req.build_id.hex);
    return false;
  }
  if (expected_crc) {
    auto crc = FileCrc32(file);
    if (!crc || *crc != *expected_crc) {
      spdlog::debug("{}: skipping debug file {}: CRC32 {} does not match the .gnu_debuglink's {:08x}", binary,
                    file.name(), crc ? fmt::format("{:08x}", *crc) : crc.error().message, *expected_crc);
      return false;
    }
  }
  const ElfSection* symtab = d.FindType(SHT_SYMTAB);
  if (symtab == nullptr) {
    spdlog::debug("{}: skipping debug file {}: it has no .symtab", binary, file.name());
    return false;
  }
  if (admit && !admit(LoadPlanBytes(d, false), file.name())) return false;
  // Read into a scratch table first so a file that fails half-way leaves no
  // partial symbols behind.
  SymbolTable table;
  uint64_t seen = 0;
  std::vector<uint64_t> found;
  auto st = ReadSymbols(d, *symtab, ExecSections(d), options, nullptr, &found, table, seen,
                        options.keep_whole_objects && !img.is_go);
  if (!st) {
    spdlog::debug("{}: skipping debug file: {}", binary, st.error().message);
    return false;
  }
  for (const Symbol& s : table.all()) img.symbols.Add(s.addr, s.size, s.name);
  img.symbols_seen += seen;
  addrs.insert(addrs.end(), found.begin(), found.end());
  return true;
}

// Tries the debug sources in order (DebugSearch); returns which one provided
// a .symtab, or nullopt. Files beside the binary mark the image as named from
// the tenant's files.
std::optional<SymbolSource> LoadDebugSymtab(std::string_view binary, const DebugFileRequest& req,
                                            const LoadOptions& options, const AdmitFn& admit,
                                            std::vector<uint64_t>& addrs, BinaryImage& img) {
  const DebugSearch& search = options.debug;
  auto try_file = [&](Result<guard::GuardedFile> file, std::optional<uint32_t> crc) {
    if (!file) return false;  // absent: the usual case, not worth a log line
    return TryDebugFile(binary, *file, req, crc, options, admit, addrs, img);
  };
  if (req.link) {
    for (const std::string& path : BesideCandidates(req.dir, req.link->name)) {
      if (try_file(OpenBeside(req, path), req.link->crc)) {
        img.tenant_sources = true;
        return SymbolSource::kDebugLink;
      }
    }
    for (const std::string& path : DebugRootCandidates(req.dir, req.link->name, search.debug_roots)) {
      if (try_file(guard::OpenHostFile(path), req.link->crc)) return SymbolSource::kDebugLink;
    }
  }
  // Only GNU build-ids name files in .build-id trees and on debuginfod servers.
  if (!req.build_id.gnu) return std::nullopt;
  for (const std::string& path : BuildIdCandidates(req.build_id.hex, search.debug_roots)) {
    if (try_file(guard::OpenHostFile(path), std::nullopt)) return SymbolSource::kBuildIdDebugDir;
  }
  if (search.use_debuginfod) {
    auto fd = FetchFromDebuginfod(req.build_id.hex, search.debuginfod_timeout);
    if (!fd) {
      spdlog::debug("{}: {}", binary, fd.error().message);
    } else if (try_file(guard::OpenHostFile(fmt::format("/proc/self/fd/{}", fd->get())), std::nullopt)) {
      return SymbolSource::kDebuginfod;
    }
  }
  return std::nullopt;
}

// Names from a static archive of the same build (DebugSearch::static_archives
// and the soname defaults). Returns true if an archive passed the same-build
// check; its matches are then in `img` and their addresses in `addrs`.
bool LoadStaticArchive(const ElfFile& so, std::string_view soname, const DebugFileRequest& req,
                       const LoadOptions& options, const AdmitFn& admit, std::vector<uint64_t>& addrs,
                       BinaryImage& img) {
  const DebugSearch& search = options.debug;
  struct Candidate {
    std::string path;
    bool beside;  // in the library's own directory, inside its process's root
  };
  std::vector<Candidate> candidates;
  for (const std::string& path : search.static_archives) candidates.push_back({path, false});
  for (std::string& path : DefaultStaticArchives(soname, search.static_archive_sonames, {req.dir})) {
    candidates.push_back({path, req.origin->root != nullptr});                        // beside the library
    if (req.origin->root != nullptr) candidates.push_back({std::move(path), false});  // the agent's own copy
  }
  for (const Candidate& c : candidates) {
    auto file = c.beside ? OpenBeside(req, c.path) : guard::OpenHostFile(c.path);
    if (!file) continue;  // absent: the usual case
    if (admit && !admit(file->size(), file->name())) continue;
    auto index = GetArchiveIndex(*file);
    if (!index) {
      spdlog::debug("{}: skipping static archive: {}", so.path(), index.error().message);
      continue;
    }
    auto match = MatchArchive(so, **index);
    if (!match) {
      spdlog::debug("{}: skipping static archive: {}", so.path(), match.error().message);
      continue;
    }
    const ArchiveMatchStats& st = match->stats;
    spdlog::debug(
        "{}: {} names for {} functions from {} ({} of {} exports verified; {} of {} FDE ranges unique, {} "
        "ambiguous; {} more from {} anchored sections)",
        so.path(), match->functions.size(), st.functions, file->name(), st.exports_matched, st.exports_checked,
        st.fde_unique, st.fde_ranges, st.fde_ambiguous, st.anchored_functions, st.anchored_sections);
    uint64_t last = UINT64_MAX;
    for (const MatchedFunction& f : match->functions) {
      ++img.symbols_seen;
      if (f.addr != last) addrs.push_back(f.addr);
      last = f.addr;
      if (!options.keep || options.keep(f.name)) img.symbols.Add(f.addr, f.size, f.name);
    }
    if (c.beside) img.tenant_sources = true;
    return true;
  }
  return false;
}

// The PT_LOAD segments: they map sample addresses to vaddrs.
Result<std::vector<LoadSegment>> LoadSegmentsOf(const ElfFile& f) {
  std::vector<LoadSegment> out;
  for (size_t i = 0; i < f.program_headers().size(); ++i) {
    const GElf_Phdr& phdr = f.program_headers()[i];
    if (phdr.p_type != PT_LOAD) continue;
    // The kernel would not map such a segment either; without this, garbage
    // read as headers (a corrupt e_phnum) would become bogus mappings.
    if (phdr.p_filesz > phdr.p_memsz || phdr.p_offset > f.size() || f.size() - phdr.p_offset < phdr.p_filesz) {
      return MakeError(
          "{}: PT_LOAD program header {} is corrupt (offset {:#x}, file size {:#x}, memory size "
          "{:#x}, file {} bytes)",
          f.path(), i, phdr.p_offset, phdr.p_filesz, phdr.p_memsz, f.size());
    }
    out.push_back(LoadSegment{phdr.p_offset, phdr.p_vaddr, phdr.p_filesz, phdr.p_memsz, (phdr.p_flags & PF_X) != 0});
  }
  return out;
}

// The DT_SONAME of the first SHT_DYNAMIC section that has one; "" if none.
Result<std::string> ReadSoname(const ElfFile& f) {
  for (const ElfSection& s : f.sections()) {
    if (s.index == 0 || s.shdr.sh_type != SHT_DYNAMIC) continue;
    auto bytes = f.SectionBytes(s);
    if (!bytes) return bytes.error();
    Elf_Data* data = bytes->empty() ? nullptr : f.data(s);
    const size_t dyn_size = gelf_fsize(f.elf(), ELF_T_DYN, 1, EV_CURRENT);
    for (size_t i = 0; data != nullptr && i < data->d_size / dyn_size; ++i) {
      GElf_Dyn dyn;
      if (gelf_getdyn(data, static_cast<int>(i), &dyn) == nullptr || dyn.d_tag == DT_NULL) break;
      if (dyn.d_tag != DT_SONAME) continue;
      auto soname = f.StringAt(s.shdr.sh_link, dyn.d_un.d_val);
      if (!soname) {
        return MakeError("{}: DT_SONAME offset {:#x} is outside the dynamic string table", f.path(), dyn.d_un.d_val);
      }
      return std::string(*soname);
    }
  }
  return std::string();
}

// Function starts from .eh_frame_hdr (BinaryImage::function_starts).
// Optional information: a missing, unusual or cut-short table leaves none,
// never an error. The table is usable for search only as the linker writes
// it: version 1, entries of two 4-byte offsets from the section's start.
void ReadFunctionStarts(const ElfFile& f, const ElfSection* eh_frame_hdr, BinaryImage& img) {
  if (eh_frame_hdr == nullptr) return;
  const ElfSection& s = *eh_frame_hdr;
  auto bytes = f.SectionBytes(s);
  if (!bytes || bytes->size() < 4) return;
  const uint8_t* p = bytes->data();
  const uint8_t* end = p + bytes->size();
  const uint8_t version = p[0], ptr_enc = p[1], count_enc = p[2], table_enc = p[3];
  p += 4;
  uint64_t ignored = 0, count = 0;
  if (version != 1 || table_enc != (DW_EH_PE_datarel | DW_EH_PE_sdata4) || ptr_enc == DW_EH_PE_omit ||
      count_enc == DW_EH_PE_omit || !eh::ReadEncoded(p, end, ptr_enc, &ignored) ||
      !eh::ReadEncoded(p, end, count_enc, &count) || count > static_cast<uint64_t>(end - p) / 8) {
    return;
  }
  std::vector<int32_t> starts(count);
  for (uint64_t i = 0; i < count; ++i, p += 8) std::memcpy(&starts[i], p, sizeof(int32_t));
  if (!std::is_sorted(starts.begin(), starts.end())) return;
  img.function_base = s.shdr.sh_addr;
  img.function_starts = std::move(starts);
}

// The sections LoadBinaryImage reads by role (the first of each), and
// whether they show a Go binary.
struct KeySections {
  const ElfSection* symtab = nullptr;
  const ElfSection* dynsym = nullptr;
  const ElfSection* debuglink = nullptr;
  const ElfSection* eh_frame_hdr = nullptr;
  bool go = false;
};

KeySections FindKeySections(const ElfFile& f) {
  KeySections k;
  for (const ElfSection& s : f.sections()) {
    if (s.index == 0) continue;
    if (s.shdr.sh_type == SHT_SYMTAB && k.symtab == nullptr) k.symtab = &s;
    if (s.shdr.sh_type == SHT_DYNSYM && k.dynsym == nullptr) k.dynsym = &s;
    if (s.name == ".gopclntab" || s.name == ".data.rel.ro.gopclntab" || s.name == ".go.buildinfo") k.go = true;
    if (s.name == ".gnu_debuglink" && k.debuglink == nullptr) k.debuglink = &s;
    if (s.name == ".eh_frame_hdr" && k.eh_frame_hdr == nullptr) k.eh_frame_hdr = &s;
  }
  return k;
}

// The binary's own primary symbols: .symtab, else Go's pclntab. False when
// it has neither.
Result<bool> ReadOwnSymbols(const ElfFile& f, const std::vector<bool>& exec, const KeySections& key,
                            const LoadOptions& options, std::vector<uint64_t>& addrs, BinaryImage& img) {
  if (key.symtab != nullptr) {
    auto st = ReadSymbols(f, *key.symtab, exec, options, nullptr, &addrs, img.symbols, img.symbols_seen,
                          options.keep_whole_objects && !img.is_go);
    if (!st) return st.error();
    img.symbol_source = SymbolSource::kSymtab;
    return true;
  }
  auto go = ReadGoPclntab(f, options, addrs, img);
  if (!go) return go.error();
  if (*go) img.symbol_source = SymbolSource::kGoPclntab;
  return *go;
}

// Primary symbols from elsewhere for a stripped binary: a separate debug
// file (DebugSearch), else a static archive of the same build. False when
// neither has them.
bool LoadOutsideSymbols(const ElfFile& f, const ImageOrigin& origin, const BuildId& build_id,
                        const ElfSection* debuglink, const LoadOptions& options, const AdmitFn& admit,
                        std::vector<uint64_t>& addrs, BinaryImage& img) {
  std::optional<DebugLink> link;
  if (debuglink != nullptr) {
    auto bytes = f.SectionBytes(*debuglink, guard::kMaxNoteBytes);
    if (bytes) link = ParseDebugLink(*bytes, f.big_endian());
    if (!link) spdlog::debug("{}: ignoring a malformed .gnu_debuglink section", f.path());
  }
  std::string dir = DirName(origin.path);
  if (dir.empty() || dir.front() != '/') dir.clear();
  DebugFileRequest request{build_id, link, std::move(dir), &origin};
  if (auto source = LoadDebugSymtab(f.path(), request, options, admit, addrs, img)) {
    img.symbol_source = *source;
    return true;
  }
  if (LoadStaticArchive(f, img.soname, request, options, admit, addrs, img)) {
    img.symbol_source = SymbolSource::kStaticArchive;
    return true;
  }
  return false;
}

// Adds the functions a library's own tables name, except at an export's
// address (`export_addrs`, sorted): the export's own name wins there.
void AddTableFunctions(const std::vector<TableFunction>& functions, const std::vector<uint64_t>& export_addrs,
                       const LoadOptions& options, BinaryImage& img) {
  for (const TableFunction& t : functions) {
    if (std::binary_search(export_addrs.begin(), export_addrs.end(), t.addr)) continue;
    ++img.symbols_seen;
    if (!options.keep || options.keep(t.name)) img.symbols.Add(t.addr, t.size, t.name);
  }
}

// What one table reader made of the file: its functions added as from
// `source`, or a debug line saying why there are none (`what`: the
// tables' name).
template <typename Tables, typename Describe>
void AddReadTables(const Result<Tables>& tables, SymbolSource source, std::string_view what, Describe describe,
                   const ElfFile& f, const std::vector<uint64_t>& export_addrs, const LoadOptions& options,
                   BinaryImage& img) {
  if (!tables) {
    spdlog::debug("{}: no {}: {}", f.path(), what, tables.error().message);
    return;
  }
  if (tables->functions.empty()) return;
  AddTableFunctions(tables->functions, export_addrs, options, img);
  img.symbol_source = source;
  spdlog::debug("{}: {}", f.path(), describe(tables->stats));
}

// Last resort for a stripped shared library: its own tables name the
// functions behind its exports (library_tables.h for OpenSSL 3,
// boringssl_tables.h for BoringSSL, told apart by a BoringSSL-only export so
// that only one of them reads the file). Only logged when they cannot.
void LoadTableSymbols(const ElfFile& f, const std::vector<uint64_t>& export_addrs, const LoadOptions& options,
                      BinaryImage& img) {
  const bool boringssl = std::any_of(img.symbols.all().begin(), img.symbols.all().end(), [](const Symbol& s) {
    return s.name == "BORINGSSL_self_test" || s.name == "CRYPTO_is_confidential_build" ||
           s.name == "EVP_AEAD_CTX_seal_scatter";
  });
  if (boringssl) {
    AddReadTables(
        ReadBoringSslTables(f), SymbolSource::kMethodTables, "method tables",
        [](const BoringSslTablesStats& st) {
          return fmt::format("{} functions named from {} getters and {} curves", st.functions, st.getters, st.curves);
        },
        f, export_addrs, options, img);
    return;
  }
  AddReadTables(
      ReadLibraryTables(f), SymbolSource::kLibraryTables, "library tables",
      [](const LibraryTablesStats& st) {
        return fmt::format("{} functions named from {} provider algorithms in {} tables", st.functions, st.algorithms,
                           st.tables);
      },
      f, export_addrs, options, img);
}

}  // namespace

Result<std::string> ReadBuildId(const guard::GuardedFile& file) {
  auto f = ElfFile::Open(file);
  if (!f) return f.error();
  return FindBuildIdNote(*f).hex;
}

Result<std::shared_ptr<const BinaryImage>> LoadBinaryImage(const guard::GuardedFile& file, const ImageOrigin& origin,
                                                           const LoadOptions& options, const AdmitFn& admit) {
  auto opened = ElfFile::Open(file);
  if (!opened) return opened.error();
  const ElfFile& f = *opened;
  auto img = std::make_shared<BinaryImage>();
  auto segments = LoadSegmentsOf(f);
  if (!segments) return segments.error();
  img->segments = std::move(*segments);
  const BuildId build_id = FindBuildIdNote(f);
  img->build_id = build_id.hex;

  const std::vector<bool> exec = ExecSections(f);
  const KeySections key = FindKeySections(f);
  img->is_go = key.go;
  // What this load reads and keeps at its peak, before it reads any of it
  // (the headers are read: ElfFile::Open). A stripped shared library may be
  // named from its own tables, which read its loadable segments.
  const bool may_read_tables = key.symtab == nullptr && !key.go && options.debug.library_tables;
  if (admit && !admit(LoadPlanBytes(f, may_read_tables), origin.path)) {
    return MakeError("{}: not loaded: over the agent's memory limit", origin.path);
  }
  auto soname = ReadSoname(f);
  if (!soname) return soname.error();
  img->soname = std::move(*soname);

  // Symbols: .symtab, else Go's pclntab, else a debug file or a static
  // archive; .dynsym fills in what those lack.
  std::vector<uint64_t> primary_addrs;
  auto own = ReadOwnSymbols(f, exec, key, options, primary_addrs, *img);
  if (!own) return own.error();
  const bool have_primary =
      *own || LoadOutsideSymbols(f, origin, build_id, key.debuglink, options, admit, primary_addrs, *img);
  std::vector<uint64_t> dynsym_addrs;
  if (key.dynsym != nullptr) {
    std::sort(primary_addrs.begin(), primary_addrs.end());
    uint64_t before = img->symbols_seen;
    auto st = ReadSymbols(f, *key.dynsym, exec, options, have_primary ? &primary_addrs : nullptr,
                          have_primary ? nullptr : &dynsym_addrs, img->symbols, img->symbols_seen);
    if (!st) return st.error();
    if (!have_primary && img->symbols_seen > before) img->symbol_source = SymbolSource::kDynsym;
  }
  if (!have_primary && !img->soname.empty() && options.debug.library_tables) {
    std::sort(dynsym_addrs.begin(), dynsym_addrs.end());
    LoadTableSymbols(f, dynsym_addrs, options, *img);
  }
  img->symbols.Finalize();
  if (f.x86_64()) img->import_calls = ReadImportCalls(f, options);
  ReadFunctionStarts(f, key.eh_frame_hdr, *img);
  // Everything libelf read (section copies, headers) is freed when `opened`
  // goes out of scope here; only the kept symbols stay.
  return std::shared_ptr<const BinaryImage>(std::move(img));
}

Result<std::shared_ptr<const BinaryImage>> ImageCache::Get(const guard::GuardedFile& file, const ImageOrigin& origin,
                                                           const AdmitFn& admit) {
  const std::string identity =
      fmt::format("{}:{}:{}:{}:{}", file.id().dev, file.id().ino, file.size(), file.mtime_ns(), file.ctime_ns());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = images_.find(identity); it != images_.end()) return it->second;
  }
  // The same content elsewhere (another container's copy of the library):
  // its image, if that was named from the file and the host alone.
  std::string content;
  if (file.size() <= kMaxContentHashedBytes) {
    if (auto hash = file.Sha256()) content = std::move(*hash);
  }
  if (!content.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = by_content_.find(content); it != by_content_.end()) {
      if (auto image = it->second.lock()) return images_.emplace(identity, std::move(image)).first->second;
    }
  }
  // Loaded without the lock so one slow binary does not stall lookups of
  // others. Two threads may load the same new file at once; the first
  // insert wins and both return the same image.
  auto image = LoadBinaryImage(file, origin, options_, admit);
  if (!image) return image.error();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = images_.emplace(identity, std::move(*image)).first;
  if (!content.empty() && !it->second->tenant_sources) by_content_[content] = it->second;
  return it->second;
}

void ImageCache::Prune() {
  std::lock_guard<std::mutex> lock(mu_);
  // An image shared by several files (same content) is held once per entry.
  std::unordered_map<const BinaryImage*, long> entries;
  for (const auto& [identity, image] : images_) ++entries[image.get()];
  std::unordered_set<const BinaryImage*> unused;
  for (const auto& [identity, image] : images_) {
    if (image.use_count() == entries[image.get()]) unused.insert(image.get());
  }
  std::erase_if(images_, [&unused](const auto& entry) { return unused.contains(entry.second.get()); });
  std::erase_if(by_content_, [](const auto& entry) { return entry.second.expired(); });
}

size_t ImageCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return images_.size();
}

}  // namespace tlsprof::symbols
