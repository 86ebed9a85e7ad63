// DeadlineWorker: runs work that a tenant can make block, off the caller's
// thread, and waits for it only so long.
//
// Reading a file another process controls can block for as long as that
// process likes: a file on a FUSE mount it serves (rootless containers'
// fuse-overlayfs) answers open and read when its daemon does, a debuginfod
// server when it does, a debug file of gigabytes takes seconds to check.
// The window loop must not wait for any of it. So such work runs on a
// worker thread, and the loop waits for it up to a deadline: past it, Run()
// returns without the result, the work goes on, and its result is kept
// where the work itself puts it (a thread-safe cache) for the next time the
// loop asks. Work that is late is counted (guard::Reason::kDeadline).
//
// Work runs on up to kMaxWorkers threads at once, started as work comes: a
// load that waits on a slow server does not hold up the next one. A worker
// that is stuck (one job running past kStuckAfter, 30 s) is left to its job
// and no longer counted, at most kMaxStuck times in the life of the process,
// so a tenant that blocks every job holds kMaxStuck + kMaxWorkers threads at
// most. Work then queues, each caller waiting only its own deadline, and
// past kMaxQueued jobs new work is refused at once (counted too); the loop
// runs on without it.
//
// Jobs must own what they touch (shared_ptr captures) or touch only
// thread-safe state: the caller may be gone when a late job ends.
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tlsprof::guard {

// How long to wait for work: up to `wait`, but not past `deadline` (the
// caller's own, e.g. the window's close), and at least kMinWait, which work
// that needs no I/O (a cache hit) takes to come back from the worker.
inline constexpr std::chrono::milliseconds kMinWait{20};
std::chrono::milliseconds WaitUntil(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds wait);

class DeadlineWorker {
 public:
  static constexpr std::chrono::milliseconds kStuckAfter{30000};
  static constexpr int kMaxStuck = 4;
  static constexpr int kMaxWorkers = 4;
  static constexpr size_t kMaxQueued = 256;

  struct Stats {
    uint64_t done = 0;     // jobs that finished in time
    uint64_t late = 0;     // jobs Run() stopped waiting for (they went on)
    uint64_t refused = 0;  // jobs never started: queue full or too many stuck workers
    uint64_t stuck = 0;    // workers left to a job past kStuckAfter
  };

  // `name`: the worker threads' name (top -H, /proc/PID/task/*/comm).
  // `stuck_after`: kStuckAfter but in tests.
  explicit DeadlineWorker(std::string name, std::chrono::milliseconds stuck_after = kStuckAfter);
  // Stops the idle workers; one still in a job (stuck or not) is detached
  // and ends with its job, or the process exits around it: see
  // DetachedJobs().
  ~DeadlineWorker();
  DeadlineWorker(const DeadlineWorker&) = delete;
  DeadlineWorker& operator=(const DeadlineWorker&) = delete;

  // Runs `job` on the worker and waits until it is done or `wait` has
  // passed. True when it is done; false when it is late (it goes on) or
  // was refused. `what` names the work in the refusal log line.
  bool Run(std::function<void()> job, std::chrono::milliseconds wait, const std::string& what);

  // Waits until no job is queued or running, up to `wait`. True when idle.
  // For an orderly end (and tests): the common case is a job that ends
  // soon, and a process that then exits with nothing left running.
  bool WaitIdle(std::chrono::milliseconds wait);

  Stats stats() const;

  // Jobs still running on threads of DeadlineWorkers already destroyed, in
  // the whole process. A process must not run its static destructors under
  // them (a job logs, and the logger is one): main() ends with _Exit when
  // this is not 0.
  static int DetachedJobs();

 private:
  struct Job {
    std::function<void()> fn;
    bool done = false;
  };
  struct Worker {
    std::shared_ptr<Job> current;  // null when idle
    std::chrono::steady_clock::time_point started{};
    bool stuck = false;
    bool detached = false;  // its DeadlineWorker is gone; counted in DetachedJobs()
  };
  // Everything the threads touch: they hold it too, so a stuck thread that
  // ends after the DeadlineWorker is gone still finds it.
  struct Shared {
    std::string name;
    std::chrono::milliseconds stuck_after{};
    std::mutex mu;
    std::condition_variable work;  // a job was queued, or stop
    std::condition_variable done;  // a job finished
    std::deque<std::shared_ptr<Job>> queue;
    std::vector<std::shared_ptr<Worker>> workers;  // every worker started, stuck ones too
    std::vector<std::thread> threads;              // one per worker, in the same order
    int idle = 0;                                  // workers waiting for a job
    bool stop = false;
    Stats stats;
  };
  static void Loop(std::shared_ptr<Shared> shared, std::shared_ptr<Worker> self);
  static void StartWorkerLocked(const std::shared_ptr<Shared>& shared);
  void MarkStuckLocked(std::chrono::steady_clock::time_point now);

  std::shared_ptr<Shared> shared_;
};

}  // namespace tlsprof::guard
