// Calls into imported functions, found by decoding an image's code (x86-64).
//
// A public API entry that ends in a tail call leaves no frame of its own:
// OpenSSL 3's EVP_PKEY_sign jumps into the provider's signing function, so a
// stack through a stripped libcrypto reads main → [libcrypto] → ... and
// never names the operation. The caller still says it: the instruction before
// its return address is `call EVP_PKEY_sign@plt` (e8 rel32 to a PLT stub) or
// `call *EVP_PKEY_sign@GOTPCREL(%rip)` (ff 15 disp32 to a GOT slot), and the
// stub's or slot's dynamic relocation names the function. ImportCalls maps
// such return addresses to the names, so the unwinder's frames can be
// completed with the API entry a tail call erased.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tlsprof::symbols {

struct ImportCalls {
  std::vector<std::string> names;                    // imported functions that are called
  std::vector<std::pair<uint64_t, uint32_t>> sites;  // (return address vaddr, index into names), sorted

  // The function that the call ending right before `return_vaddr` calls, if
  // it is a call to a (kept) import.
  std::optional<std::string_view> CalleeAt(uint64_t return_vaddr) const;
  bool empty() const { return sites.empty(); }
};

// One section of an ELF64 little-endian file, as FindImportCalls needs it.
struct SectionView {
  std::string_view name;
  uint32_t type = 0;               // sh_type
  uint64_t addr = 0;               // sh_addr
  uint32_t link = 0;               // sh_link (index into the same list)
  bool exec = false;               // SHF_EXECINSTR
  std::span<const uint8_t> bytes;  // empty for SHT_NOBITS; may be left empty for code sections (see code)
};

// Scans the code of an x86-64 image (all sections, indexed as in the file)
// for calls to imported functions whose name `keep` accepts (null: all).
// The code of an executable section other than the PLT is read through
// `code(index)` (so a binary that imports nothing kept never has its text
// read); when `code` is null, SectionView::bytes is used.
// Sections that do not parse are skipped; the result is then partial, never
// wrong: a site is recorded only where the decoded target is exactly a PLT
// stub or GOT slot with a JUMP_SLOT/GLOB_DAT relocation.
ImportCalls FindImportCalls(std::span<const SectionView> sections, const std::function<bool(std::string_view)>& keep,
                            const std::function<std::span<const uint8_t>(size_t index)>& code = nullptr);

}  // namespace tlsprof::symbols
