// The executable segments this process has loaded, for the unwinder's tests
// (unwind_test, sample/unwind_bpf_test), which build tables for them.
// Header-only; thread-safe.
#pragma once

#include <link.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tlsprof::unwind {

// One executable PT_LOAD segment of a loaded object; a fork has the same.
struct LoadedSegment {
  std::string path;  // "/proc/self/exe" for the executable
  uint64_t start = 0, end = 0, bias = 0;
};

inline std::vector<LoadedSegment> LoadedSegments() {
  std::vector<LoadedSegment> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::vector<LoadedSegment>*>(data);
        std::string path = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "/proc/self/exe";
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          out->push_back(
              {path, info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz, info->dlpi_addr});
        }
        return 0;
      },
      &out);
  return out;
}

}  // namespace tlsprof::unwind
