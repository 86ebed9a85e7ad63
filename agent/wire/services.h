// Services: how the agent groups processes for the fleet metrics
// (docs/fleet.md). A process's service is its systemd unit, from its cgroup
// (".../nginx.service" → "nginx"), else its command name; processes with no
// TLS time and no TLS library are summed into "(non-tls)". Names are cut to
// the collector's label charset. A process in a container is told apart by
// its container and pod (agent/discovery/cgroup_identity.h): two replicas of
// one image are two rows. Pure functions; thread-safe.
#pragma once

#include <compare>
#include <string>
#include <string_view>
#include <utility>

#include "agent/discovery/cgroup_identity.h"

namespace tlsprof::wire {

inline constexpr std::string_view kNonTlsService = "(non-tls)";
// Services beyond the per-report cap (kMaxServices) are summed here.
inline constexpr std::string_view kOverflowService = "(overflow)";
inline constexpr size_t kMaxServices = 64;
// Usage telemetry of processes that exited before the window closed, with no
// snapshot to name them (short-lived clients): their service is unknowable.
inline constexpr std::string_view kExitedService = "(exited)";

// The collector's label values: 1-64 characters of [A-Za-z0-9._:/()+ -].
// Other characters become '_', longer names are cut, an empty one is "unknown".
std::string SanitizeLabel(std::string_view value);
bool IsValidLabel(std::string_view value);

// The systemd unit a cgroup v2 path names: the last ".service" (or ".scope",
// ".socket") component, without its suffix and without a template instance
// ("getty@tty1.service" → "getty@tty1"). "" when the path names no unit
// (the root cgroup, a container runtime's path, user sessions' scopes).
std::string UnitFromCgroup(std::string_view cgroup);

// The service of a process: its unit, else its comm, sanitized.
std::string ServiceName(std::string_view cgroup, std::string_view comm);

// What the agent aggregates by: a service, and the container and pod its
// processes run in. "(non-tls)" and "(overflow)" never carry a container.
struct ServiceKey {
  ServiceKey() = default;
  ServiceKey(std::string name, std::string container_id = "", std::string pod_uid = "")  // NOLINT: {"name"} reads well
      : name(std::move(name)), container_id(std::move(container_id)), pod_uid(std::move(pod_uid)) {}

  std::string name;
  std::string container_id;  // docker's short id (12 hex digits), "" outside a container
  std::string pod_uid;       // canonical UUID, "" outside a Kubernetes pod
  auto operator<=>(const ServiceKey&) const = default;
};

// The key of a process: ServiceName(), and with `container_labels` (the
// default; off with --no-container-labels) the container's short id and the
// pod's UID.
ServiceKey ServiceKeyOf(std::string_view cgroup, std::string_view comm, const discovery::ContainerIdentity& container,
                        bool container_labels);

}  // namespace tlsprof::wire
