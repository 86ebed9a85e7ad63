#include "agent/sample/cpu_list.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace tlsprof::sample {
namespace {

// The kernel never lists more CPUs than NR_CPUS (at most 8192 on x86-64).
constexpr int kMaxCpu = 1 << 16;

bool ParseCpu(std::string_view s, int* cpu) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *cpu);
  return ec == std::errc() && end == s.data() + s.size() && *cpu >= 0 && *cpu < kMaxCpu;
}

}  // namespace

Result<std::vector<int>> ParseCpuList(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return MakeError("empty CPU list");
  std::vector<int> cpus;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view range = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return MakeError("malformed CPU list: trailing ','");
    size_t dash = range.find('-');
    int first = 0;
    int last = 0;
    bool ok = dash == std::string_view::npos
                  ? ParseCpu(range, &first) && ParseCpu(range, &last)
                  : ParseCpu(range.substr(0, dash), &first) && ParseCpu(range.substr(dash + 1), &last);
    if (!ok || first > last) return MakeError("malformed CPU list entry '{}'", range);
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

Result<std::vector<int>> ReadCpuList(const std::string& path) {
  std::ifstream in(path);  // guarded-io: sysfs (the kernel's CPU lists)
  if (!in) return MakeError("cannot read the CPU list {}", path);
  std::stringstream text;
  text << in.rdbuf();
  auto cpus = ParseCpuList(text.str());
  if (!cpus) return MakeError("{}: {}", path, cpus.error().message);
  return cpus;
}

}  // namespace tlsprof::sample
