// The agent's side of systemd's notify protocol (sd_notify(3)), for a unit of
// Type=notify with WatchdogSec= (packaging/systemd/tlsprof-agent.service):
// READY=1 once the agent is set up and its window loop starts, WATCHDOG=1
// every WatchdogSec/4 from a thread of its own, but only while LoopHealth
// says healthy, so a stalled loop stops the pings and systemd restarts the
// agent; STOPPING=1 when the loop ends, and the pings with it (no window
// closes during the shipper's last flush, at most 10 s, well within the
// unit's WatchdogSec=).
//
// Not under systemd (no NOTIFY_SOCKET, as in a container or a shell), or
// without WatchdogSec= (no WATCHDOG_USEC for this pid): every call does
// nothing and no thread starts.
//
// Lifecycle: construct, StartWatchdog() once the capabilities are dropped (a
// thread keeps its creator's), Ready(), Stopping(); the destructor stops the
// thread. Thread-safety: call from one thread (the loop's); the watchdog
// thread only reads the LoopHealth, which must outlive this object.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "agent/expose/health.h"

namespace tlsprof::expose {

class SystemdNotifier {
 public:
  explicit SystemdNotifier(const LoopHealth& health);
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // Starts the pings if systemd asked for them (sd_watchdog_enabled).
  void StartWatchdog();
  void Ready();
  void Stopping();

  // WatchdogSec= as systemd passed it; zero when there is no watchdog.
  std::chrono::microseconds watchdog() const { return watchdog_; }

 private:
  void PingLoop();
  void StopPings();

  const LoopHealth& health_;
  std::chrono::microseconds watchdog_{0};
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tlsprof::expose
