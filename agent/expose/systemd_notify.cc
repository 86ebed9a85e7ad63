#include "agent/expose/systemd_notify.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <cstring>

namespace tlsprof::expose {
namespace {

double Seconds(std::chrono::microseconds d) { return std::chrono::duration<double>(d).count(); }

// sd_notify without NOTIFY_SOCKET returns 0 and sends nothing.
void Notify(const char* state) {
  if (const int r = sd_notify(/*unset_environment=*/0, state); r < 0) {
    spdlog::warn("systemd notify {}: {}", state, std::strerror(-r));
  }
}

}  // namespace

SystemdNotifier::SystemdNotifier(const LoopHealth& health) : health_(health) {}

SystemdNotifier::~SystemdNotifier() { StopPings(); }

void SystemdNotifier::StopPings() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void SystemdNotifier::StartWatchdog() {
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) {
    spdlog::warn(
        "systemd watchdog: WATCHDOG_USEC does not parse ({}); no pings, so systemd restarts the agent after "
        "WatchdogSec=: fix the unit's environment",
        std::strerror(-r));
    return;
  }
  if (r == 0 || usec == 0) return;
  watchdog_ = std::chrono::microseconds(usec);
  spdlog::info(
      "systemd watchdog: WatchdogSec={:g} s; pinging every {:g} s while a window closes at least every {} "
      "intervals",
      Seconds(watchdog_), Seconds(watchdog_ / 4), kStallIntervals);
  thread_ = std::thread([this] { PingLoop(); });
}

void SystemdNotifier::Ready() { Notify("READY=1"); }

void SystemdNotifier::Stopping() {
  Notify("STOPPING=1");
  // No windows close while the shipper flushes: that is no stall.
  StopPings();
}

void SystemdNotifier::PingLoop() {
  pthread_setname_np(pthread_self(), "tlsprof-wdog");  // top -H, /proc/PID/task/*/comm
  // A quarter of WatchdogSec=: three pings may be late (a starved host)
  // before systemd counts one missing.
  const auto period = watchdog_ / 4;
  bool was_healthy = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const HealthVerdict verdict = health_.Check(LoopHealth::Clock::now());
    if (verdict.healthy) {
      Notify("WATCHDOG=1");
      if (!was_healthy) spdlog::warn("window loop healthy again ({}); systemd watchdog pings resumed", verdict.text);
    } else if (was_healthy) {
      spdlog::error(
          "window loop {}; systemd watchdog pings stop, so systemd restarts the agent within "
          "WatchdogSec={:g} s",
          verdict.text, Seconds(watchdog_));
    }
    was_healthy = verdict.healthy;
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}

}  // namespace tlsprof::expose
