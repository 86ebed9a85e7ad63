#include "agent/guard/deadline.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>

#include "agent/guard/limits.h"

namespace tlsprof::guard {
namespace {
std::atomic<int> g_detached_jobs{0};
}  // namespace

std::chrono::milliseconds WaitUntil(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds wait) {
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return kMinWait;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
  return std::max(kMinWait, std::min(wait, left));
}

DeadlineWorker::DeadlineWorker(std::string name, std::chrono::milliseconds stuck_after)
    : shared_(std::make_shared<Shared>()) {
  shared_->name = std::move(name);
  shared_->stuck_after = stuck_after;
}

DeadlineWorker::~DeadlineWorker() {
  std::vector<bool> busy;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
    for (const auto& w : shared_->workers) {
      const bool in_job = w->current != nullptr;
      busy.push_back(w->stuck || in_job);
      if (in_job) {
        w->detached = true;
        g_detached_jobs.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  shared_->work.notify_all();
  // Threads were started in the order of shared_->workers. One still in a
  // job is not waited for (it may never end, and shutdown must not wait on a
  // tenant): it holds the shared state and ends with its job or the process.
  for (size_t i = 0; i < busy.size(); ++i) {
    std::thread& t = shared_->threads[i];
    if (busy[i]) {
      t.detach();
    } else {
      t.join();
    }
  }
}

void DeadlineWorker::StartWorkerLocked(const std::shared_ptr<Shared>& shared) {
  auto w = std::make_shared<Worker>();
  shared->workers.push_back(w);
  shared->threads.emplace_back([shared, w] { Loop(shared, w); });
}

void DeadlineWorker::Loop(std::shared_ptr<Shared> shared, std::shared_ptr<Worker> self) {
  pthread_setname_np(pthread_self(), shared->name.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(shared->mu);
  for (;;) {
    ++shared->idle;
    shared->work.wait(lock, [&] { return shared->stop || !shared->queue.empty(); });
    --shared->idle;
    if (shared->stop) return;
    self->current = std::move(shared->queue.front());
    shared->queue.pop_front();
    self->started = std::chrono::steady_clock::now();
    std::shared_ptr<Job> job = self->current;
    lock.unlock();
    job->fn();
    lock.lock();
    job->done = true;
    self->current.reset();
    shared->done.notify_all();
    if (self->detached) {
      g_detached_jobs.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    if (self->stuck) return;  // it was given up on: it takes no more work
  }
}

// Gives up on workers whose job has run past stuck_after (they no longer
// count as capacity), at most kMaxStuck in all. Called with the lock held.
void DeadlineWorker::MarkStuckLocked(std::chrono::steady_clock::time_point now) {
  Shared& s = *shared_;
  for (const auto& w : s.workers) {
    if (w->stuck || !w->current || now - w->started < s.stuck_after) continue;
    if (s.stats.stuck >= static_cast<uint64_t>(kMaxStuck)) return;
    w->stuck = true;
    ++s.stats.stuck;
    Refuse(Reason::kDeadline, s.name,
           fmt::format("a job has run for over {} ms; its worker is left to it ({} of at most {})",
                       s.stuck_after.count(), s.stats.stuck, kMaxStuck));
  }
}

bool DeadlineWorker::Run(std::function<void()> fn, std::chrono::milliseconds wait, const std::string& what) {
  auto job = std::make_shared<Job>();
  job->fn = std::move(fn);
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mu);
  const auto now = std::chrono::steady_clock::now();
  MarkStuckLocked(now);
  int live = 0;  // workers not given up on
  for (const auto& w : s.workers) live += w->stuck ? 0 : 1;
  if (s.queue.size() >= kMaxQueued) {
    ++s.stats.refused;
    lock.unlock();
    Refuse(Reason::kDeadline, what, "not started: too much work is queued behind work that does not end");
    return false;
  }
  s.queue.push_back(job);
  if (s.idle < static_cast<int>(s.queue.size()) && live < kMaxWorkers) StartWorkerLocked(shared_);
  s.work.notify_one();
  if (s.done.wait_for(lock, wait, [&] { return job->done; })) {
    ++s.stats.done;
    return true;
  }
  ++s.stats.late;
  lock.unlock();
  Refuse(Reason::kDeadline, what,
         fmt::format("not done within {} ms; it goes on, and its result is kept for later", wait.count()));
  return false;
}

bool DeadlineWorker::WaitIdle(std::chrono::milliseconds wait) {
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mu);
  return s.done.wait_for(lock, wait, [&] {
    if (!s.queue.empty()) return false;
    return std::none_of(s.workers.begin(), s.workers.end(), [](const auto& w) { return w->current != nullptr; });
  });
}

int DeadlineWorker::DetachedJobs() { return g_detached_jobs.load(std::memory_order_relaxed); }

DeadlineWorker::Stats DeadlineWorker::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

}  // namespace tlsprof::guard
