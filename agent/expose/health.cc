#include "agent/expose/health.h"

#include <fmt/format.h>

#include <algorithm>

namespace tlsprof::expose {
namespace {

// A record later than `now` (a Check() that read the clock before the loop
// wrote) counts as 0 s ago.
double Seconds(LoopHealth::Clock::duration d) { return std::max(0.0, std::chrono::duration<double>(d).count()); }

int64_t Ticks(LoopHealth::Clock::time_point t) { return t.time_since_epoch().count(); }

LoopHealth::Clock::time_point At(int64_t ticks) {
  return LoopHealth::Clock::time_point(LoopHealth::Clock::duration(ticks));
}

}  // namespace

LoopHealth::LoopHealth(Clock::duration interval, Clock::time_point created) : interval_(interval), created_(created) {}

void LoopHealth::LoopStarted(Clock::time_point now) { loop_started_.store(Ticks(now)); }

void LoopHealth::WindowClosed(Clock::time_point now) {
  last_close_.store(Ticks(now));
  windows_.fetch_add(1);
}

HealthVerdict LoopHealth::Check(Clock::time_point now) const {
  const int64_t started = loop_started_.load();
  const int64_t closed = last_close_.load();
  const std::string interval = fmt::format("interval {:g} s", Seconds(interval_));
  if (started == kNever && closed == kNever) {
    const double setting_up = Seconds(now - created_);
    if (now - created_ < kSetupLimit) {
      return {true, fmt::format("ok: setting up for {:.1f} s (the first snapshot of every process; limit {} s)",
                                setting_up, kSetupLimit.count())};
    }
    return {false, fmt::format("stalled: the set-up has taken {:.1f} s (limit {} s)", setting_up, kSetupLimit.count())};
  }
  const auto limit = kStallIntervals * interval_;
  if (closed == kNever) {
    const double ago = Seconds(now - At(started));
    if (now - At(started) < limit) {
      return {true, fmt::format("ok: no window closed yet; the loop started {:.1f} s ago ({})", ago, interval)};
    }
    return {false, fmt::format("stalled: no window closed since the loop started {:.1f} s ago ({}; stalled after {} "
                               "intervals)",
                               ago, interval, kStallIntervals)};
  }
  const double ago = Seconds(now - At(closed));
  if (now - At(closed) < limit) {
    return {true, fmt::format("ok: window {} closed {:.1f} s ago ({})", windows_.load(), ago, interval)};
  }
  return {false, fmt::format("stalled: the last window closed {:.1f} s ago ({}; stalled after {} intervals)", ago,
                             interval, kStallIntervals)};
}

}  // namespace tlsprof::expose
