// Whether the window loop of `tlsprof-agent run` is alive: the answer of
// GET /healthz on --metrics-listen and the condition of the systemd
// watchdog's pings (systemd_notify.h). docs/fleet.md, "Health", is the
// contract for operators.
//
// The rule, on the steady clock, from the loop's own record:
// - set-up (from construction until LoopStarted: the sampler's load and the
//   first snapshot of every process): healthy for kSetupLimit;
// - the loop started, no window closed yet: healthy until kStallIntervals
//   intervals after LoopStarted;
// - afterwards: healthy while the last WindowClosed is less than
//   kStallIntervals intervals ago; stalled (503) from then on, until the next
//   window closes.
// A stall is anything that keeps the loop from closing windows: a blocking
// read of a file a container controls, a sink that hangs, a starved host.
// Only the loop's thread writes the record; Check() takes no lock, so the
// HTTP threads and the watchdog answer whatever the loop's thread is stuck in.
//
// Thread-safety: LoopStarted() and WindowClosed() from one thread (the
// loop's); Check() from any thread, concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace tlsprof::expose {

// Windows missed before the loop counts as stalled: one late window (a slow
// close on a busy host) is not a stall, three in a row are.
inline constexpr int kStallIntervals = 3;
// The longest set-up that is still healthy. The first snapshot reads every
// process's maps, symbols and unwind tables; it is bounded by the number of
// processes, not by the interval. The systemd unit's TimeoutStartSec= is the
// same (packaging/systemd/tlsprof-agent.service).
inline constexpr std::chrono::seconds kSetupLimit{300};

struct HealthVerdict {
  bool healthy = true;
  // One line for a person: what the loop did last and when; for a stall, how
  // long ago the last window closed and the interval.
  std::string text;
};

class LoopHealth {
 public:
  using Clock = std::chrono::steady_clock;

  // `created`: the start of the set-up.
  LoopHealth(Clock::duration interval, Clock::time_point created);

  // The loop's record: its first iteration, and the end of each window's
  // close (the window handed to its sinks).
  void LoopStarted(Clock::time_point now);
  void WindowClosed(Clock::time_point now);

  HealthVerdict Check(Clock::time_point now) const;

  Clock::duration interval() const { return interval_; }

 private:
  const Clock::duration interval_;
  const Clock::time_point created_;
  // Steady-clock ticks since its epoch; kNever until recorded.
  static constexpr int64_t kNever = INT64_MIN;
  std::atomic<int64_t> loop_started_{kNever};
  std::atomic<int64_t> last_close_{kNever};
  std::atomic<uint64_t> windows_{0};
};

}  // namespace tlsprof::expose
