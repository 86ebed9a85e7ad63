#include "agent/symbols/binary_image.h"

#include <gelf.h>
#include <libelf.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>

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

// Go's linker tags its build ID note with owner "Go" and this type
// (cmd/link/internal/ld/elf.go, ELF_NOTE_GOBUILDID_TAG).
constexpr uint32_t kGoBuildIdNoteType = 4;

// An open ELF file. ELF_C_READ (not ELF_C_READ_MMAP): libelf reads headers up
// front and each section only when asked, into its own buffers that elf_end()
// frees. A mapping would save the copy but turns a file truncated while we read
// it (a library replaced in place) into SIGBUS, which would kill the agent.
struct ElfFile {
  ElfPtr elf;
  uint64_t file_size = 0;
  GElf_Ehdr ehdr{};
  std::string path;
};

Result<ElfFile> OpenElf(int fd, std::string_view path) {
  if (!InitLibelf()) return MakeError("libelf is too old (elf_version failed)");
  ElfFile f;
  f.path = std::string(path);
  struct stat st {};
  if (fstat(fd, &st) != 0) return MakeError("{}: fstat failed: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return MakeError("{}: not a regular file", path);
  f.file_size = static_cast<uint64_t>(st.st_size);
  if (f.file_size == 0) return MakeError("{}: empty file, not an ELF binary", path);
  f.elf.reset(elf_begin(fd, ELF_C_READ, nullptr));
  if (!f.elf) return MakeError("{}: cannot read as ELF: {}", path, ElfErr());
  if (elf_kind(f.elf.get()) != ELF_K_ELF) {
    return MakeError("{}: not an ELF file (or truncated inside the ELF header)", path);
  }
  if (gelf_getehdr(f.elf.get(), &f.ehdr) == nullptr) {
    return MakeError("{}: unreadable ELF header: {}", path, ElfErr());
  }
  // libelf quietly treats a header table that runs past the end of the file as
  // empty (sections) or shortens it (program headers). A file like that is
  // truncated or corrupt, and saying so beats returning an image without
  // symbols. Extended numbering (e_shnum 0, e_phnum PN_XNUM) keeps the real
  // count in section 0, which libelf checks itself.
  auto check_table = [&](const char* what, uint64_t off, uint64_t count, uint64_t entsize,
                         uint64_t expected_entsize) -> Status {
    if (count == 0) return OkStatus();
    if (entsize != expected_entsize) {
      return MakeError("{}: {} entries are {} bytes, expected {}; the ELF header is corrupt", path, what, entsize,
                       expected_entsize);
    }
    if (off > f.file_size || (f.file_size - off) / entsize < count) {
      return MakeError(
          "{}: {} table ({} entries at offset {:#x}) extends past the end of the file ({} bytes); "
          "the file is truncated or corrupt",
          path, what, count, off, f.file_size);
    }
    return OkStatus();
  };
  const bool is64 = gelf_getclass(f.elf.get()) == ELFCLASS64;
  if (f.ehdr.e_phnum != PN_XNUM) {
    auto st = check_table("program header", f.ehdr.e_phoff, f.ehdr.e_phnum, f.ehdr.e_phentsize,
                          is64 ? sizeof(Elf64_Phdr) : sizeof(Elf32_Phdr));
    if (!st) return st.error();
  }
  uint64_t shnum = f.ehdr.e_shnum;
  if (shnum == 0 && f.ehdr.e_shoff != 0) shnum = 1;  // at least section 0 (extended numbering)
  if (f.ehdr.e_shoff != 0 || f.ehdr.e_shnum != 0) {
    auto st = check_table("section header", f.ehdr.e_shoff, shnum, f.ehdr.e_shentsize,
                          is64 ? sizeof(Elf64_Shdr) : sizeof(Elf32_Shdr));
    if (!st) return st.error();
  }
  return f;
}

// The bytes of a section, read by libelf (owned by the Elf handle). Checks the
// extent against the file first so the message names the section.
Result<std::span<const uint8_t>> SectionBytes(const ElfFile& f, Elf_Scn* scn, const GElf_Shdr& shdr,
                                              std::string_view name) {
  if (shdr.sh_type == SHT_NOBITS || shdr.sh_size == 0) return std::span<const uint8_t>{};
  if (shdr.sh_offset > f.file_size || f.file_size - shdr.sh_offset < shdr.sh_size) {
    return MakeError(
        "{}: section {} ({} bytes at offset {:#x}) extends past the end of the file ({} bytes); "
        "the file is truncated or corrupt",
        f.path, name, shdr.sh_size, shdr.sh_offset, f.file_size);
  }
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (data == nullptr) return MakeError("{}: cannot read section {}: {}", f.path, name, ElfErr());
  if (data->d_buf == nullptr) return std::span<const uint8_t>{};
  return std::span<const uint8_t>(static_cast<const uint8_t*>(data->d_buf), data->d_size);
}

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

// Scans one block of notes. Records the GNU build ID, or else the first Go
// build ID. Returns true once a GNU build ID is found (nothing better exists).
bool ScanNotes(Elf_Data* data, std::string& gnu, std::string& go) {
  GElf_Nhdr nhdr;
  size_t name_off = 0, desc_off = 0;
  for (size_t off = 0; off < data->d_size;) {
    size_t next = gelf_getnote(data, off, &nhdr, &name_off, &desc_off);
    if (next == 0) break;  // malformed tail: keep what was found
    const auto* base = static_cast<const uint8_t*>(data->d_buf);
    // Owners are NUL-padded: Go writes "Go\0\0" with n_namesz 4.
    std::string_view owner(reinterpret_cast<const char*>(base + name_off), nhdr.n_namesz);
    owner = owner.substr(0, owner.find('\0'));
    std::span<const uint8_t> desc(base + desc_off, nhdr.n_descsz);
    if (owner == "GNU" && nhdr.n_type == NT_GNU_BUILD_ID && !desc.empty()) {
      gnu = Hex(desc);
      return true;
    }
    if (owner == "Go" && nhdr.n_type == kGoBuildIdNoteType && !desc.empty() && go.empty()) {
      go = Hex(desc);
    }
    off = next;
  }
  return false;
}

// Build ID: NT_GNU_BUILD_ID as lowercase hex. Go binaries linked internally
// have no GNU note; they get the Go build ID note's bytes (an ASCII string
// such as "abc/def/ghi/jkl"), hex-encoded so build_id is always lowercase hex.
// Such an ID serves as a cache key but will not be known to debuginfod.
// PT_NOTE segments are read first: they survive section-header stripping and
// are what the loader maps; SHT_NOTE sections are the fallback.
struct BuildId {
  std::string hex;
  bool gnu = false;  // NT_GNU_BUILD_ID (what debug files and debuginfod are keyed by)
};

BuildId FindBuildIdNote(const ElfFile& f) {
  std::string gnu, go;
  Elf* elf = f.elf.get();
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr phdr;
      if (gelf_getphdr(elf, static_cast<int>(i), &phdr) == nullptr) break;  // reported by the loader
      if (phdr.p_type != PT_NOTE || phdr.p_filesz == 0) continue;
      if (phdr.p_offset > f.file_size || f.file_size - phdr.p_offset < phdr.p_filesz) continue;
      Elf_Data* data = elf_getdata_rawchunk(elf, static_cast<int64_t>(phdr.p_offset), phdr.p_filesz,
                                            phdr.p_align == 8 ? ELF_T_NHDR8 : ELF_T_NHDR);
      if (data != nullptr && ScanNotes(data, gnu, go)) return {gnu, true};
    }
  }
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_NOTE) continue;
    if (shdr.sh_offset > f.file_size || f.file_size - shdr.sh_offset < shdr.sh_size) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data != nullptr && ScanNotes(data, gnu, go)) return {gnu, true};
  }
  return {go, false};
}

struct Section {
  Elf_Scn* scn = nullptr;
  GElf_Shdr shdr{};
  std::string name;
};

// Reads the function symbols of one .symtab/.dynsym section.
//  - `exec_sections[i]` says whether section i holds code (for STT_NOTYPE);
//  - `skip_addrs` (sorted) are addresses the primary table already covers:
//    .dynsym only fills holes of .symtab/pclntab, so its versioned aliases are
//    neither counted twice nor stored twice;
//  - `addrs_out`, if set, collects every function address seen (pre-filter);
//  - `whole_objects`: options.keep_whole_objects applies (a .symtab of a
//    binary that is not Go).
Status ReadSymbols(const ElfFile& f, const Section& sec, const std::vector<Section>& sections,
                   const std::vector<bool>& exec_sections, const LoadOptions& options,
                   const std::vector<uint64_t>* skip_addrs, std::vector<uint64_t>* addrs_out, SymbolTable& out,
                   uint64_t& seen, bool whole_objects = false) {
  Elf* elf = f.elf.get();
  const size_t sym_size = gelf_fsize(elf, ELF_T_SYM, 1, EV_CURRENT);
  if (sec.shdr.sh_entsize != sym_size) {
    return MakeError("{}: {} has entry size {}, expected {}; the symbol table is corrupt", f.path, sec.name,
                     sec.shdr.sh_entsize, sym_size);
  }
  if (sec.shdr.sh_size % sym_size != 0) {
    return MakeError("{}: {} size {} is not a multiple of its entry size {}", f.path, sec.name, sec.shdr.sh_size,
                     sym_size);
  }
  if (sec.shdr.sh_link == 0 || sec.shdr.sh_link >= sections.size() ||
      sections[sec.shdr.sh_link].shdr.sh_type != SHT_STRTAB) {
    return MakeError("{}: {} links to section {}, which is not a string table", f.path, sec.name, sec.shdr.sh_link);
  }
  const Section& strsec = sections[sec.shdr.sh_link];
  auto strtab = SectionBytes(f, strsec.scn, strsec.shdr, strsec.name);
  if (!strtab) return strtab.error();
  auto syms = SectionBytes(f, sec.scn, sec.shdr, sec.name);
  if (!syms) return syms.error();
  Elf_Data* data = elf_getdata(sec.scn, nullptr);  // cached by libelf: same buffer as `syms`
  if (data == nullptr && !syms->empty()) return MakeError("{}: cannot read {}: {}", f.path, sec.name, ElfErr());

  const size_t count = syms->size() / sym_size;
  const char* strings = reinterpret_cast<const char*>(strtab->data());
  whole_objects = whole_objects && options.keep && sec.shdr.sh_type == SHT_SYMTAB;
  std::vector<LinkedFunction> linked;   // every sized function, when whole_objects
  int32_t object = -1;                  // the last STT_FILE's index
  for (size_t i = 1; i < count; ++i) {  // entry 0 is the reserved null symbol
    GElf_Sym sym;
    if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) {
      return MakeError("{}: cannot read symbol {} of {}: {}", f.path, i, sec.name, ElfErr());
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
      return MakeError("{}: symbol {} of {} has name offset {:#x} beyond its string table {} ({} bytes)", f.path, i,
                       sec.name, sym.st_name, strsec.name, strtab->size());
    }
    const char* name_begin = strings + sym.st_name;
    const void* nul = std::memchr(name_begin, '\0', strtab->size() - sym.st_name);
    if (nul == nullptr) {
      return MakeError("{}: symbol {} of {} has an unterminated name at offset {:#x}", f.path, i, sec.name,
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
uint64_t GoTextStart(const ElfFile& f, const std::vector<Section>& sections, uint64_t field_vaddr) {
  for (const Section& s : sections) {
    if (s.shdr.sh_type != SHT_RELA) continue;
    auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
    Elf_Data* data = bytes && !bytes->empty() ? elf_getdata(s.scn, nullptr) : nullptr;
    if (data == nullptr) continue;
    const size_t rela_size = gelf_fsize(f.elf.get(), ELF_T_RELA, 1, EV_CURRENT);
    for (size_t i = 0; i < data->d_size / rela_size; ++i) {
      GElf_Rela rela;
      if (gelf_getrela(data, static_cast<int>(i), &rela) == nullptr) break;
      if (rela.r_offset == field_vaddr) return static_cast<uint64_t>(rela.r_addend);
    }
  }
  for (const Section& s : sections) {
    if (s.name == ".text") return s.shdr.sh_addr;
  }
  return 0;
}

// Function symbols from Go's pclntab (a Go binary without .symtab). Looks for
// the .gopclntab section (".data.rel.ro.gopclntab" in internally linked PIEs),
// else for the table's header inside .data.rel.ro (externally linked PIEs,
// where the C linker merged it). Returns false when no pclntab was found.
Result<bool> ReadGoPclntab(const ElfFile& f, const std::vector<Section>& sections, const LoadOptions& options,
                           std::vector<uint64_t>& addrs, BinaryImage& img) {
  std::span<const uint8_t> table;
  uint64_t table_vaddr = 0;
  for (const Section& s : sections) {
    if (s.name == ".gopclntab" || s.name == ".data.rel.ro.gopclntab") {
      auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
      if (!bytes) return bytes.error();
      table = *bytes;
      table_vaddr = s.shdr.sh_addr;
      break;
    }
  }
  // The magic scan runs only for binaries already known to be Go (they keep
  // .go.buildinfo even when stripped), so C libraries never pay for it.
  if (table.empty() && img.is_go) {
    for (const Section& s : sections) {
      if (s.name != ".data.rel.ro") continue;
      auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
      if (!bytes) return bytes.error();
      if (auto off = FindGoPclntab(*bytes)) {
        table = bytes->subspan(*off);
        table_vaddr = s.shdr.sh_addr + *off;
      }
      break;
    }
  }
  if (table.empty()) return false;
  auto header = ParseGoPclntabHeader(table);
  if (!header) return MakeError("{}: {}", f.path, header.error().message);
  uint64_t text_start = header->text_start;
  if (text_start == 0 && header->version >= GoPclntabVersion::kGo118) {
    text_start = GoTextStart(f, sections, table_vaddr + 8 + 2ull * header->ptr_size);
  }
  auto visited = ForEachGoFunction(table, text_start, [&](uint64_t entry, uint64_t end, std::string_view name) {
    ++img.symbols_seen;
    addrs.push_back(entry);
    if (end > entry && (!options.keep || options.keep(name))) img.symbols.Add(entry, end - entry, name);
  });
  if (!visited) return MakeError("{}: {}", f.path, visited.error().message);
  img.is_go = true;
  return true;
}

// Section headers, read once. Names come from .shstrtab through elf_strptr,
// which bounds-checks the offsets.
struct Sections {
  std::vector<Section> sections;
  std::vector<bool> exec;  // exec[i]: section i holds code (SHF_EXECINSTR)
};

Result<Sections> ReadSections(const ElfFile& f) {
  Elf* elf = f.elf.get();
  size_t shnum = 0, shstrndx = 0;
  if (elf_getshdrnum(elf, &shnum) != 0) {
    return MakeError("{}: cannot read the section header count: {}", f.path, ElfErr());
  }
  if (shnum > 0 && elf_getshdrstrndx(elf, &shstrndx) != 0) {
    return MakeError("{}: cannot find the section name table: {}", f.path, ElfErr());
  }
  Sections out;
  out.sections.resize(shnum);
  out.exec.assign(shnum, false);
  for (size_t i = 0; i < shnum; ++i) {
    Section& s = out.sections[i];
    s.scn = elf_getscn(elf, i);
    if (s.scn == nullptr || gelf_getshdr(s.scn, &s.shdr) == nullptr) {
      return MakeError("{}: cannot read section header {} of {} (e_shoff {:#x}): {}", f.path, i, shnum, f.ehdr.e_shoff,
                       ElfErr());
    }
    if (i != 0) {
      const char* name = elf_strptr(elf, shstrndx, s.shdr.sh_name);
      if (name != nullptr) s.name = name;
    }
    out.exec[i] = (s.shdr.sh_flags & SHF_EXECINSTR) != 0;
  }
  return out;
}

// Calls to kept imports (import_calls.h). Optional information: a section
// that cannot be read is left out, never an error.
ImportCalls ReadImportCalls(const ElfFile& f, const std::vector<Section>& sections, const LoadOptions& options) {
  auto bytes_of = [&](const Section& s) {
    auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
    if (!bytes) spdlog::debug("{}", bytes.error().message);
    return bytes ? *bytes : std::span<const uint8_t>{};
  };
  std::vector<SectionView> views(sections.size());
  for (size_t i = 0; i < sections.size(); ++i) {
    const Section& s = sections[i];
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
  std::string host_dir;           // its directory as the agent can open it
  std::string ns_dir;             // its directory inside its mount namespace
};

// Reads the .symtab of one candidate debug file into `img` (collecting the
// addresses into `addrs`). Returns false, with a debug log saying why, if the
// file does not belong to the binary, is malformed or has no .symtab; `img` is
// then untouched.
bool TryDebugFile(std::string_view binary, int fd, const std::string& path, const DebugFileRequest& req,
                  std::optional<uint32_t> expected_crc, const LoadOptions& options, std::vector<uint64_t>& addrs,
                  BinaryImage& img) {
  auto opened = OpenElf(fd, path);
  if (!opened) {
    spdlog::debug("{}: skipping debug file: {}", binary, opened.error().message);
    return false;
  }
  const ElfFile& d = *opened;
  if (expected_crc) {
    auto crc = FileCrc32(fd);
    if (!crc || *crc != *expected_crc) {
      spdlog::debug("{}: skipping debug file {}: CRC32 {} does not match the .gnu_debuglink's {:08x}", binary, path,
                    crc ? fmt::format("{:08x}", *crc) : crc.error().message, *expected_crc);
      return false;
    }
  }
  // A binary without a GNU build-id can only be matched by the debuglink CRC.
  const BuildId debug_id = FindBuildIdNote(d);
  if (req.build_id.gnu && (!debug_id.gnu || debug_id.hex != req.build_id.hex)) {
    spdlog::debug("{}: skipping debug file {}: its build-id {} does not match the binary's {}", binary, path,
                  debug_id.hex.empty() ? "(none)" : debug_id.hex, req.build_id.hex);
    return false;
  }
  auto sections = ReadSections(d);
  if (!sections) {
    spdlog::debug("{}: skipping debug file: {}", binary, sections.error().message);
    return false;
  }
  const Section* symtab = nullptr;
  for (const Section& s : sections->sections) {
    if (s.shdr.sh_type == SHT_SYMTAB) {
      symtab = &s;
      break;
    }
  }
  if (symtab == nullptr) {
    spdlog::debug("{}: skipping debug file {}: it has no .symtab", binary, path);
    return false;
  }
  // Read into a scratch table first so a file that fails half-way leaves no
  // partial symbols behind.
  SymbolTable table;
  uint64_t seen = 0;
  std::vector<uint64_t> found;
  auto st = ReadSymbols(d, *symtab, sections->sections, sections->exec, options, nullptr, &found, table, seen,
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
// a .symtab, or nullopt.
std::optional<SymbolSource> LoadDebugSymtab(std::string_view binary, const DebugFileRequest& req,
                                            const LoadOptions& options, std::vector<uint64_t>& addrs,
                                            BinaryImage& img) {
  const DebugSearch& search = options.debug;
  auto try_path = [&](const std::string& path, std::optional<uint32_t> crc) {
    UniqueFd fd = OpenDebugCandidate(path);
    if (!fd.valid()) return false;  // absent: the usual case, not worth a log line
    return TryDebugFile(binary, fd.get(), path, req, crc, options, addrs, img);
  };
  if (req.link) {
    for (const std::string& path : DebugLinkCandidates(req.host_dir, req.ns_dir, req.link->name, search.debug_roots)) {
      if (try_path(path, req.link->crc)) return SymbolSource::kDebugLink;
    }
  }
  // Only GNU build-ids name files in .build-id trees and on debuginfod servers.
  if (!req.build_id.gnu) return std::nullopt;
  for (const std::string& path : BuildIdCandidates(req.build_id.hex, search.debug_roots)) {
    if (try_path(path, std::nullopt)) return SymbolSource::kBuildIdDebugDir;
  }
  if (search.use_debuginfod) {
    auto fd = FetchFromDebuginfod(req.build_id.hex, search.debuginfod_timeout);
    if (!fd) {
      spdlog::debug("{}: {}", binary, fd.error().message);
    } else if (TryDebugFile(binary, fd->get(), "debuginfod:" + req.build_id.hex, req, std::nullopt, options, addrs,
                            img)) {
      return SymbolSource::kDebuginfod;
    }
  }
  return std::nullopt;
}

// Names from a static archive of the same build (DebugSearch::static_archives
// and the soname defaults). Returns true if an archive passed the same-build
// check; its matches are then in `img` and their addresses in `addrs`.
bool LoadStaticArchive(int fd, std::string_view binary, std::string_view soname, const DebugFileRequest& req,
                       const LoadOptions& options, std::vector<uint64_t>& addrs, BinaryImage& img) {
  const DebugSearch& search = options.debug;
  std::vector<std::string> candidates = search.static_archives;
  for (std::string& path : DefaultStaticArchives(soname, search.static_archive_sonames, {req.host_dir, req.ns_dir})) {
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) {
      candidates.push_back(std::move(path));
    }
  }
  for (const std::string& path : candidates) {
    if (access(path.c_str(), R_OK) != 0) continue;  // absent: the usual case
    auto index = GetArchiveIndex(path);
    if (!index) {
      spdlog::debug("{}: skipping static archive: {}", binary, index.error().message);
      continue;
    }
    auto match = MatchArchive(fd, binary, **index);
    if (!match) {
      spdlog::debug("{}: skipping static archive: {}", binary, match.error().message);
      continue;
    }
    const ArchiveMatchStats& st = match->stats;
    spdlog::debug(
        "{}: {} names for {} functions from {} ({} of {} exports verified; {} of {} FDE ranges unique, {} "
        "ambiguous; {} more from {} anchored sections)",
        binary, match->functions.size(), st.functions, path, st.exports_matched, st.exports_checked, st.fde_unique,
        st.fde_ranges, st.fde_ambiguous, st.anchored_functions, st.anchored_sections);
    uint64_t last = UINT64_MAX;
    for (const MatchedFunction& f : match->functions) {
      ++img.symbols_seen;
      if (f.addr != last) addrs.push_back(f.addr);
      last = f.addr;
      if (!options.keep || options.keep(f.name)) img.symbols.Add(f.addr, f.size, f.name);
    }
    return true;
  }
  return false;
}

// The PT_LOAD segments: they map sample addresses to vaddrs.
Result<std::vector<LoadSegment>> LoadSegmentsOf(const ElfFile& f) {
  Elf* elf = f.elf.get();
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) {
    return MakeError("{}: cannot read the program header count: {}", f.path, ElfErr());
  }
  std::vector<LoadSegment> out;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr phdr;
    if (gelf_getphdr(elf, static_cast<int>(i), &phdr) == nullptr) {
      return MakeError("{}: cannot read program header {} of {} (e_phoff {:#x}): {}", f.path, i, phnum, f.ehdr.e_phoff,
                       ElfErr());
    }
    if (phdr.p_type != PT_LOAD) continue;
    // The kernel would not map such a segment either; without this, garbage
    // read as headers (a corrupt e_phnum) would become bogus mappings.
    if (phdr.p_filesz > phdr.p_memsz || phdr.p_offset > f.file_size || f.file_size - phdr.p_offset < phdr.p_filesz) {
      return MakeError(
          "{}: PT_LOAD program header {} is corrupt (offset {:#x}, file size {:#x}, memory size "
          "{:#x}, file {} bytes)",
          f.path, i, phdr.p_offset, phdr.p_filesz, phdr.p_memsz, f.file_size);
    }
    out.push_back(LoadSegment{phdr.p_offset, phdr.p_vaddr, phdr.p_filesz, phdr.p_memsz, (phdr.p_flags & PF_X) != 0});
  }
  return out;
}

// The DT_SONAME of the first SHT_DYNAMIC section that has one; "" if none.
Result<std::string> ReadSoname(const ElfFile& f, const std::vector<Section>& sections) {
  Elf* elf = f.elf.get();
  for (const Section& s : sections) {
    if (s.shdr.sh_type != SHT_DYNAMIC) continue;
    auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
    if (!bytes) return bytes.error();
    Elf_Data* data = bytes->empty() ? nullptr : elf_getdata(s.scn, nullptr);
    const size_t dyn_size = gelf_fsize(elf, ELF_T_DYN, 1, EV_CURRENT);
    for (size_t i = 0; data != nullptr && i < data->d_size / dyn_size; ++i) {
      GElf_Dyn dyn;
      if (gelf_getdyn(data, static_cast<int>(i), &dyn) == nullptr || dyn.d_tag == DT_NULL) break;
      if (dyn.d_tag != DT_SONAME) continue;
      const char* soname = elf_strptr(elf, s.shdr.sh_link, dyn.d_un.d_val);
      if (soname == nullptr) {
        return MakeError("{}: DT_SONAME offset {:#x} is outside the dynamic string table", f.path, dyn.d_un.d_val);
      }
      return std::string(soname);
    }
  }
  return std::string();
}

// Function starts from .eh_frame_hdr (BinaryImage::function_starts).
// Optional information: a missing, unusual or cut-short table leaves none,
// never an error. The table is usable for search only as the linker writes
// it: version 1, entries of two 4-byte offsets from the section's start.
void ReadFunctionStarts(const ElfFile& f, const Section* eh_frame_hdr, BinaryImage& img) {
  if (eh_frame_hdr == nullptr) return;
  const Section& s = *eh_frame_hdr;
  auto bytes = SectionBytes(f, s.scn, s.shdr, s.name);
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
  const Section* symtab = nullptr;
  const Section* dynsym = nullptr;
  const Section* debuglink = nullptr;
  const Section* eh_frame_hdr = nullptr;
  bool go = false;
};

KeySections FindKeySections(const std::vector<Section>& sections) {
  KeySections k;
  for (const Section& s : sections) {
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
Result<bool> ReadOwnSymbols(const ElfFile& f, const Sections& sections, const KeySections& key,
                            const LoadOptions& options, std::vector<uint64_t>& addrs, BinaryImage& img) {
  if (key.symtab != nullptr) {
    auto st = ReadSymbols(f, *key.symtab, sections.sections, sections.exec, options, nullptr, &addrs, img.symbols,
                          img.symbols_seen, options.keep_whole_objects && !img.is_go);
    if (!st) return st.error();
    img.symbol_source = SymbolSource::kSymtab;
    return true;
  }
  auto go = ReadGoPclntab(f, sections.sections, options, addrs, img);
  if (!go) return go.error();
  if (*go) img.symbol_source = SymbolSource::kGoPclntab;
  return *go;
}

// Primary symbols from elsewhere for a stripped binary: a separate debug
// file (DebugSearch), else a static archive of the same build. False when
// neither has them.
bool LoadOutsideSymbols(int fd, const ElfFile& f, std::string_view display_path, std::string_view host_dir,
                        const BuildId& build_id, const Section* debuglink, const LoadOptions& options,
                        std::vector<uint64_t>& addrs, BinaryImage& img) {
  std::optional<DebugLink> link;
  if (debuglink != nullptr) {
    auto bytes = SectionBytes(f, debuglink->scn, debuglink->shdr, debuglink->name);
    if (bytes) link = ParseDebugLink(*bytes, f.ehdr.e_ident[EI_DATA] == ELFDATA2MSB);
    if (!link) spdlog::debug("{}: ignoring a malformed .gnu_debuglink section", f.path);
  }
  std::string own_dir = DirName(display_path);
  std::string dir = host_dir.empty() && !own_dir.empty() && own_dir.front() == '/' ? own_dir : std::string(host_dir);
  DebugFileRequest request{build_id, link, std::move(dir), std::move(own_dir)};
  if (auto source = LoadDebugSymtab(f.path, request, options, addrs, img)) {
    img.symbol_source = *source;
    return true;
  }
  if (LoadStaticArchive(fd, f.path, img.soname, request, options, addrs, img)) {
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
    spdlog::debug("{}: no {}: {}", f.path, what, tables.error().message);
    return;
  }
  if (tables->functions.empty()) return;
  AddTableFunctions(tables->functions, export_addrs, options, img);
  img.symbol_source = source;
  spdlog::debug("{}: {}", f.path, describe(tables->stats));
}

// Last resort for a stripped shared library: its own tables name the
// functions behind its exports (library_tables.h for OpenSSL 3,
// boringssl_tables.h for BoringSSL, told apart by a BoringSSL-only export so
// that only one of them reads the file). Only logged when they cannot.
void LoadTableSymbols(int fd, const ElfFile& f, const std::vector<uint64_t>& export_addrs, const LoadOptions& options,
                      BinaryImage& img) {
  const bool boringssl = std::any_of(img.symbols.all().begin(), img.symbols.all().end(), [](const Symbol& s) {
    return s.name == "BORINGSSL_self_test" || s.name == "CRYPTO_is_confidential_build" ||
           s.name == "EVP_AEAD_CTX_seal_scatter";
  });
  if (boringssl) {
    AddReadTables(
        ReadBoringSslTables(fd, f.path), SymbolSource::kMethodTables, "method tables",
        [](const BoringSslTablesStats& st) {
          return fmt::format("{} functions named from {} getters and {} curves", st.functions, st.getters, st.curves);
        },
        f, export_addrs, options, img);
    return;
  }
  AddReadTables(
      ReadLibraryTables(fd, f.path), SymbolSource::kLibraryTables, "library tables",
      [](const LibraryTablesStats& st) {
        return fmt::format("{} functions named from {} provider algorithms in {} tables", st.functions, st.algorithms,
                           st.tables);
      },
      f, export_addrs, options, img);
}

}  // namespace

Result<std::string> ReadBuildId(int fd) {
  auto f = OpenElf(fd, "fd " + std::to_string(fd));
  if (!f) return f.error();
  return FindBuildIdNote(*f).hex;
}

Result<std::shared_ptr<const BinaryImage>> LoadBinaryImage(int fd, std::string_view display_path,
                                                           const LoadOptions& options, std::string_view host_dir) {
  auto opened = OpenElf(fd, display_path);
  if (!opened) return opened.error();
  const ElfFile& f = *opened;
  auto img = std::make_shared<BinaryImage>();
  auto segments = LoadSegmentsOf(f);
  if (!segments) return segments.error();
  img->segments = std::move(*segments);
  const BuildId build_id = FindBuildIdNote(f);
  img->build_id = build_id.hex;

  auto read_sections = ReadSections(f);
  if (!read_sections) return read_sections.error();
  const std::vector<Section>& sections = read_sections->sections;
  const KeySections key = FindKeySections(sections);
  img->is_go = key.go;
  auto soname = ReadSoname(f, sections);
  if (!soname) return soname.error();
  img->soname = std::move(*soname);

  // Symbols: .symtab, else Go's pclntab, else a debug file or a static
  // archive; .dynsym fills in what those lack.
  std::vector<uint64_t> primary_addrs;
  auto own = ReadOwnSymbols(f, *read_sections, key, options, primary_addrs, *img);
  if (!own) return own.error();
  const bool have_primary =
      *own || LoadOutsideSymbols(fd, f, display_path, host_dir, build_id, key.debuglink, options, primary_addrs, *img);
  std::vector<uint64_t> dynsym_addrs;
  if (key.dynsym != nullptr) {
    std::sort(primary_addrs.begin(), primary_addrs.end());
    uint64_t before = img->symbols_seen;
    auto st =
        ReadSymbols(f, *key.dynsym, sections, read_sections->exec, options, have_primary ? &primary_addrs : nullptr,
                    have_primary ? nullptr : &dynsym_addrs, img->symbols, img->symbols_seen);
    if (!st) return st.error();
    if (!have_primary && img->symbols_seen > before) img->symbol_source = SymbolSource::kDynsym;
  }
  if (!have_primary && !img->soname.empty() && options.debug.library_tables) {
    std::sort(dynsym_addrs.begin(), dynsym_addrs.end());
    LoadTableSymbols(fd, f, dynsym_addrs, options, *img);
  }
  img->symbols.Finalize();
  if (f.ehdr.e_machine == EM_X86_64 && gelf_getclass(f.elf.get()) == ELFCLASS64 &&
      f.ehdr.e_ident[EI_DATA] == ELFDATA2LSB) {
    img->import_calls = ReadImportCalls(f, sections, options);
  }
  ReadFunctionStarts(f, key.eh_frame_hdr, *img);
  // Everything libelf read (section copies, headers) is freed when `opened`
  // goes out of scope here; only the kept symbols stay.
  return std::shared_ptr<const BinaryImage>(std::move(img));
}

Result<std::shared_ptr<const BinaryImage>> ImageCache::Get(int fd, std::string_view display_path,
                                                           std::string_view host_dir) {
  auto build_id = ReadBuildId(fd);
  if (!build_id) return MakeError("{}: {}", display_path, build_id.error().message);
  std::string key;
  if (!build_id->empty()) {
    key = "build-id:" + *build_id;
  } else {
    struct stat st {};
    if (fstat(fd, &st) != 0) return MakeError("{}: fstat failed: {}", display_path, std::strerror(errno));
    key =
        fmt::format("file:{}:{}:{}:{}.{:09}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = images_.find(key); it != images_.end()) return it->second;
  }
  // Loaded without the lock so one slow binary does not stall lookups of
  // others. Two threads may load the same new binary at once; the first
  // insert wins and both return the same image.
  auto image = LoadBinaryImage(fd, display_path, options_, host_dir);
  if (!image) return image.error();
  std::lock_guard<std::mutex> lock(mu_);
  return images_.emplace(std::move(key), std::move(*image)).first->second;
}

void ImageCache::Prune() {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(images_, [](const auto& entry) { return entry.second.use_count() == 1; });
}

size_t ImageCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return images_.size();
}

}  // namespace tlsprof::symbols
