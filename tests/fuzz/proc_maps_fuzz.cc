// /proc/PID/maps and /proc/PID/cgroup text (agent/discovery): what a process
// controls there is the path of each mapping (any file name it can create, up
// to " (deleted)" suffixes and spaces) and the names of its cgroups (inside a
// container with cgroup namespaces and delegation, any name it likes).
//
// Input: text, parsed by both.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "agent/discovery/cgroup_identity.h"
#include "agent/discovery/proc_maps.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tlsprof::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tlsprof::discovery;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto maps = ParseMaps(text)) {
    for (const Mapping& m : *maps) {
      if (m.end < m.start) __builtin_trap();  // ParseMaps rejects such lines
      (void)m.contains(m.start);
      (void)m.is_file();
    }
  }
  ContainerIdentity id = IdentityFromCgroupFile(text);
  // Documented shapes: 64 hex digits (or none), a canonical UUID (or none).
  if (!id.container_id.empty() && id.container_id.size() != 64) __builtin_trap();
  if (!id.pod_uid.empty() && id.pod_uid.size() != 36) __builtin_trap();
  (void)id.ShortId();
  (void)CgroupV2Path(text);
  return 0;
}
