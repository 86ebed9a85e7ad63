// CPU lists in the kernel's text format, as in /sys/devices/system/cpu/online
// ("0-3,5,7-8"). Stateless functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace tlsprof::sample {

inline constexpr const char* kOnlineCpusPath = "/sys/devices/system/cpu/online";

// Parses a CPU list into ascending, de-duplicated CPU numbers. A trailing
// newline is accepted; anything else malformed is an Error.
Result<std::vector<int>> ParseCpuList(std::string_view text);

// Reads and parses a CPU list file (by default the online CPUs).
Result<std::vector<int>> ReadCpuList(const std::string& path = kOnlineCpusPath);

}  // namespace tlsprof::sample
