#include "agent/wire/services.h"

#include <algorithm>
#include <array>

namespace tlsprof::wire {
namespace {

bool IsLabelChar(char c) {
  static constexpr std::string_view kExtra = "._:/()+ -";
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         kExtra.find(c) != std::string_view::npos;
}

}  // namespace

std::string SanitizeLabel(std::string_view value) {
  std::string out;
  out.reserve(std::min<size_t>(value.size(), 64));
  for (char c : value) {
    if (out.size() == 64) break;
    out.push_back(IsLabelChar(c) ? c : '_');
  }
  if (out.empty()) return "unknown";
  return out;
}

bool IsValidLabel(std::string_view value) {
  return !value.empty() && value.size() <= 64 && std::all_of(value.begin(), value.end(), IsLabelChar);
}

std::string UnitFromCgroup(std::string_view cgroup) {
  // Units that run a service's processes. A user session's processes sit in
  // session-N.scope: that names no service, so the comm is better there.
  static constexpr std::array<std::string_view, 2> kSuffixes = {".service", ".socket"};
  while (!cgroup.empty()) {
    const size_t slash = cgroup.rfind('/');
    const std::string_view component = slash == std::string_view::npos ? cgroup : cgroup.substr(slash + 1);
    for (std::string_view suffix : kSuffixes) {
      if (component.size() > suffix.size() && component.ends_with(suffix)) {
        std::string_view unit = component.substr(0, component.size() - suffix.size());
        // user@1000.service holds a user's whole systemd instance: not a service.
        if (unit.starts_with("user@")) return "";
        return std::string(unit);
      }
    }
    if (slash == std::string_view::npos) break;
    cgroup = cgroup.substr(0, slash);
  }
  return "";
}

std::string ServiceName(std::string_view cgroup, std::string_view comm) {
  std::string unit = UnitFromCgroup(cgroup);
  return SanitizeLabel(unit.empty() ? comm : unit);
}

ServiceKey ServiceKeyOf(std::string_view cgroup, std::string_view comm, const discovery::ContainerIdentity& container,
                        bool container_labels) {
  ServiceKey key{ServiceName(cgroup, comm), "", ""};
  if (container_labels) {
    key.container_id = container.ShortId();
    key.pod_uid = container.pod_uid;
  }
  return key;
}

}  // namespace tlsprof::wire
