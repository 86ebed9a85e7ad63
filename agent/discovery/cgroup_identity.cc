#include "agent/discovery/cgroup_identity.h"

#include <algorithm>
#include <array>
#include <optional>

namespace tlsprof::discovery {
namespace {

// What a path component names.
enum class Names {
  kContainer,
  kPod,
  // A runtime's monitor process (conmon): outside the container it watches,
  // and outside that container's pod.
  kMonitor,
};

enum class IdForm {
  kHex64,            // a container id: 64 lowercase hex digits
  kUuid,             // a pod UID: 8-4-4-4-12 lowercase hex, dashed
  kUuidUnderscored,  // the same with '_' for '-' (systemd slice names use '-' as the hierarchy separator)
};

enum class Parent {
  kAny,
  kNamed,  // the component right above is `parent_name`
  kPod,    // the component right above named a pod (cgroupfs driver: /kubepods/<qos>/pod<uid>/<id>)
};

// A component that names something: exactly prefix + ID + suffix.
struct Rule {
  Names names;
  std::string_view runtime;  // of a container row
  std::string_view prefix;
  IdForm id;
  std::string_view suffix;
  Parent parent = Parent::kAny;
  std::string_view parent_name = {};
};

// First match wins, per component: the monitors come before the container
// rows that share their prefix.
constexpr std::array kRules = {
    // Runtime monitors (conmon), beside the container's own scope.
    Rule{Names::kMonitor, "cri-o", "crio-conmon-", IdForm::kHex64, ".scope"},
    Rule{Names::kMonitor, "podman", "libpod-conmon-", IdForm::kHex64, ".scope"},
    // systemd cgroup driver: one transient scope per container,
    //   /system.slice/docker-<id>.scope
    //   /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope
    //   /machine.slice/libpod-<id>.scope, /user.slice/.../user@1000.service/user.slice/libpod-<id>.scope
    Rule{Names::kContainer, "docker", "docker-", IdForm::kHex64, ".scope"},
    Rule{Names::kContainer, "containerd", "cri-containerd-", IdForm::kHex64, ".scope"},
    Rule{Names::kContainer, "containerd", "nerdctl-", IdForm::kHex64, ".scope"},
    Rule{Names::kContainer, "cri-o", "crio-", IdForm::kHex64, ".scope"},
    Rule{Names::kContainer, "podman", "libpod-", IdForm::kHex64, ".scope"},
    // cgroupfs driver: one directory per container,
    //   /docker/<id>, /libpod_parent/libpod-<id>, /kubepods/burstable/pod<uid>/<id>
    Rule{Names::kContainer, "docker", "", IdForm::kHex64, "", Parent::kNamed, "docker"},
    Rule{Names::kContainer, "podman", "libpod-", IdForm::kHex64, "", Parent::kNamed, "libpod_parent"},
    Rule{Names::kContainer, "cri-o", "crio-", IdForm::kHex64, "", Parent::kPod},
    // containerd (or dockershim): the path does not say which runtime.
    Rule{Names::kContainer, "cri", "", IdForm::kHex64, "", Parent::kPod},
    // Kubernetes pods, systemd driver: kubepods[-<qos>]-pod<uid>.slice; kind
    // and k3s-in-docker run the kubelet with --cgroup-root=/kubelet, which
    // prefixes every slice with "kubelet-".
    Rule{Names::kPod, "", "kubepods-pod", IdForm::kUuidUnderscored, ".slice"},
    Rule{Names::kPod, "", "kubepods-burstable-pod", IdForm::kUuidUnderscored, ".slice"},
    Rule{Names::kPod, "", "kubepods-besteffort-pod", IdForm::kUuidUnderscored, ".slice"},
    Rule{Names::kPod, "", "kubelet-kubepods-pod", IdForm::kUuidUnderscored, ".slice"},
    Rule{Names::kPod, "", "kubelet-kubepods-burstable-pod", IdForm::kUuidUnderscored, ".slice"},
    Rule{Names::kPod, "", "kubelet-kubepods-besteffort-pod", IdForm::kUuidUnderscored, ".slice"},
    // Kubernetes pods, cgroupfs driver: /kubepods/pod<uid> (guaranteed), /kubepods/<qos>/pod<uid>.
    Rule{Names::kPod, "", "pod", IdForm::kUuid, "", Parent::kNamed, "kubepods"},
    Rule{Names::kPod, "", "pod", IdForm::kUuid, "", Parent::kNamed, "burstable"},
    Rule{Names::kPod, "", "pod", IdForm::kUuid, "", Parent::kNamed, "besteffort"},
};

constexpr size_t kHexIdLength = 64;
constexpr size_t kUuidLength = 36;

bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

size_t IdLength(IdForm form) { return form == IdForm::kHex64 ? kHexIdLength : kUuidLength; }

// The ID in canonical form (a UUID dashed), or nullopt when `s` is not one.
std::optional<std::string> CanonicalId(std::string_view s, IdForm form) {
  if (s.size() != IdLength(form)) return std::nullopt;
  std::string out(s);
  for (size_t i = 0; i < out.size(); ++i) {
    const bool separator = form != IdForm::kHex64 && (i == 8 || i == 13 || i == 18 || i == 23);
    if (!separator) {
      if (!IsLowerHex(out[i])) return std::nullopt;
      continue;
    }
    if (out[i] != (form == IdForm::kUuid ? '-' : '_')) return std::nullopt;
    out[i] = '-';
  }
  return out;
}

struct Match {
  const Rule* rule = nullptr;
  std::string id;  // canonical
};

std::optional<Match> MatchComponent(std::string_view component, std::string_view parent, bool parent_is_pod) {
  for (const Rule& rule : kRules) {
    if (component.size() != rule.prefix.size() + IdLength(rule.id) + rule.suffix.size()) continue;
    if (!component.starts_with(rule.prefix) || !component.ends_with(rule.suffix)) continue;
    if (rule.parent == Parent::kNamed && parent != rule.parent_name) continue;
    if (rule.parent == Parent::kPod && !parent_is_pod) continue;
    auto id = CanonicalId(component.substr(rule.prefix.size(), IdLength(rule.id)), rule.id);
    if (!id) continue;
    return Match{&rule, std::move(*id)};
  }
  return std::nullopt;
}

}  // namespace

ContainerIdentity IdentityFromCgroupPath(std::string_view path) {
  ContainerIdentity out;
  // The identity outside the innermost pod so far, for a monitor inside it.
  std::optional<ContainerIdentity> outside_pod;
  std::string_view parent;
  bool parent_is_pod = false;
  while (!path.empty()) {
    const size_t slash = path.find('/');
    const std::string_view component = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
    if (component.empty()) continue;
    auto match = MatchComponent(component, parent, parent_is_pod);
    parent = component;
    parent_is_pod = false;
    if (!match) continue;
    switch (match->rule->names) {
      case Names::kContainer:
        // Deeper is more specific: a container inside another (kind,
        // docker-in-docker) replaces it.
        out.container_id = std::move(match->id);
        out.runtime = match->rule->runtime;
        break;
      case Names::kPod:
        outside_pod = out;
        out.pod_uid = std::move(match->id);
        // A container found outside the pod (the kind node) is not the
        // pod's: the pod's own container, if any, comes below.
        out.container_id.clear();
        out.runtime.clear();
        parent_is_pod = true;
        break;
      case Names::kMonitor:
        out = outside_pod.value_or(out);
        break;
    }
  }
  return out;
}

ContainerIdentity IdentityFromCgroupFile(std::string_view contents) {
  ContainerIdentity best;
  int best_rank = 0;
  while (!contents.empty()) {
    const size_t newline = contents.find('\n');
    const std::string_view line = contents.substr(0, newline);
    contents = newline == std::string_view::npos ? std::string_view() : contents.substr(newline + 1);
    // hierarchy-ID:controller-list:cgroup-path; the path may hold ':'.
    const size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    ContainerIdentity identity = IdentityFromCgroupPath(line.substr(second + 1));
    if (identity.empty()) continue;
    const bool v2 = line.substr(0, second) == "0:";
    const int rank = (identity.container_id.empty() ? 0 : 4) + (identity.pod_uid.empty() ? 0 : 2) + (v2 ? 1 : 0);
    if (rank > best_rank) {
      best_rank = rank;
      best = std::move(identity);
    }
  }
  return best;
}

std::string CgroupV2Path(std::string_view contents) {
  while (!contents.empty()) {
    const size_t newline = contents.find('\n');
    const std::string_view line = contents.substr(0, newline);
    if (line.starts_with("0::")) return std::string(line.substr(3));
    if (newline == std::string_view::npos) break;
    contents = contents.substr(newline + 1);
  }
  return "";
}

}  // namespace tlsprof::discovery
