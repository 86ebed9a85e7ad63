#include "agent/profiler/window.h"

#include <algorithm>

namespace tlsprof::profiler {

const ProcessInfo& Window::process(uint32_t tgid) const {
  static const ProcessInfo kUnnamed;
  auto it = processes.find(tgid);
  return it == processes.end() ? kUnnamed : it->second;
}

bool Window::in_scope(uint32_t tgid) const {
  if (tgid == static_cast<uint32_t>(host.agent_pid)) return false;
  return host.scope_pids.empty() ||
         std::find(host.scope_pids.begin(), host.scope_pids.end(), static_cast<pid_t>(tgid)) != host.scope_pids.end();
}

}  // namespace tlsprof::profiler
