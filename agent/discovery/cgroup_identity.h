// Container and pod identity from a process's cgroups (/proc/PID/cgroup).
//
// Container runtimes and the kubelet name the cgroups they create after the
// container id and the pod UID; the path is all the agent needs, with no
// runtime socket and no Kubernetes API. The recognised forms are one table in
// cgroup_identity.cc (one row per runtime and cgroup driver). Every line of
// the file is read: cgroup v2 ("0::/path") and v1 ("4:memory:/path",
// "9:name=systemd:/path"), since on a hybrid host a runtime with the cgroupfs
// driver may show only in the v1 hierarchies.
//
// Nesting (kind, k3s in docker, docker-in-docker): the innermost container
// on a path wins, as does the innermost pod, since that is the container the
// process actually runs in. A runtime's monitor process (CRI-O's and
// Podman's conmon) belongs to no container: it gets no identity.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace tlsprof::discovery {

struct ContainerIdentity {
  std::string container_id;  // 64 lowercase hex digits, "" when not in a container
  std::string pod_uid;       // canonical UUID (8-4-4-4-12, lowercase), "" when not in a Kubernetes pod
  std::string runtime;       // "docker", "containerd", "cri-o", "podman", "cri" (kubepods, cgroupfs driver), or ""

  bool empty() const { return container_id.empty() && pod_uid.empty(); }
  // Docker's short id, the first 12 hex digits: the label value (docs/fleet.md).
  std::string ShortId() const { return container_id.substr(0, kShortIdLength); }
  bool operator==(const ContainerIdentity&) const = default;

  static constexpr size_t kShortIdLength = 12;
};

// The identity one cgroup path names ("/kubepods/besteffort/pod<uid>/<id>").
ContainerIdentity IdentityFromCgroupPath(std::string_view path);

// The identity of a process from the contents of its /proc/PID/cgroup. The
// line naming a container wins over lines that do not (on a hybrid host the
// v1 hierarchies and the v2 one may disagree); among lines naming one, the
// one that also names a pod; then the v2 line, then file order.
ContainerIdentity IdentityFromCgroupFile(std::string_view contents);

// The cgroup v2 path in the contents of /proc/PID/cgroup (the "0::" line),
// "" when there is none.
std::string CgroupV2Path(std::string_view contents);

}  // namespace tlsprof::discovery
