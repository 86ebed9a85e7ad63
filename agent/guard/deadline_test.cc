// DeadlineWorker: the loop waits for work only so long, work that blocks
// for good (a read of a FIFO nobody writes, as a tenant's FUSE file would)
// is left to itself, and the worker goes on serving.
#include "agent/guard/deadline.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/guard/limits.h"

namespace tlsprof::guard {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

uint64_t Deadlines() { return RefusalCounts()[static_cast<size_t>(Reason::kDeadline)]; }

// A FIFO whose reader blocks until Release().
class BlockingFifo {
 public:
  BlockingFifo() {
    char tmpl[] = "/tmp/deadline_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/fifo";
    EXPECT_EQ(mkfifo(path_.c_str(), 0600), 0);
  }
  ~BlockingFifo() {
    Release();
    std::filesystem::remove_all(dir_);
    // writer_ stays open: a detached job may still be on its way to Read().
  }
  // Blocks in open() until a writer comes: the job a tenant's file makes.
  void Read() const {
    const int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) close(fd);
  }
  // Holds the FIFO open for writing (O_RDWR never blocks on Linux), so a
  // Read() now or later returns: a job still queued may start after this.
  void Release() {
    if (released_.exchange(true)) return;
    writer_ = open(path_.c_str(), O_RDWR | O_CLOEXEC);
  }

 private:
  std::string dir_, path_;
  std::atomic<bool> released_{false};
  int writer_ = -1;
};

TEST(DeadlineWorker, WorkThatEndsInTimeIsDone) {
  DeadlineWorker worker("test-deadline");
  auto value = std::make_shared<int>(0);
  EXPECT_TRUE(worker.Run([value] { *value = 42; }, 5000ms, "a quick job"));
  EXPECT_EQ(*value, 42);
  EXPECT_EQ(worker.stats().done, 1u);
  EXPECT_EQ(worker.stats().late, 0u);
}

TEST(DeadlineWorker, LateWorkGoesOnAndItsResultIsKept) {
  DeadlineWorker worker("test-deadline");
  BlockingFifo fifo;
  auto result = std::make_shared<std::atomic<int>>(0);
  const uint64_t deadlines = Deadlines();
  const auto t0 = Clock::now();
  EXPECT_FALSE(worker.Run(
      [result, &fifo] {
        fifo.Read();
        *result = 7;
      },
      200ms, "a blocking job"));
  EXPECT_LT(Clock::now() - t0, 2s);  // waited about the deadline, not for the job
  EXPECT_EQ(worker.stats().late, 1u);
  EXPECT_EQ(Deadlines(), deadlines + 1);
  EXPECT_EQ(*result, 0);
  // New work runs meanwhile (on another worker), and the late job ends,
  // putting its result where it was told to, once its read does.
  EXPECT_TRUE(worker.Run([] {}, 5000ms, "a quick job"));
  fifo.Release();
  const auto until = Clock::now() + 5s;
  while (*result == 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(*result, 7);
}

TEST(DeadlineWorker, AStuckWorkerIsReplacedAndNewWorkStillRuns) {
  DeadlineWorker worker("test-deadline", 300ms);
  BlockingFifo fifo;
  EXPECT_FALSE(worker.Run([&fifo] { fifo.Read(); }, 50ms, "a job that never ends"));
  std::this_thread::sleep_for(400ms);  // past stuck_after
  auto value = std::make_shared<int>(0);
  EXPECT_TRUE(worker.Run([value] { *value = 1; }, 5000ms, "a job after it"));
  EXPECT_EQ(*value, 1);
  EXPECT_EQ(worker.stats().stuck, 1u);
  fifo.Release();
}

// Threads of this process named `name`.
int ThreadsNamed(const std::string& name) {
  int n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string c;
    std::getline(comm, c);
    n += c == name ? 1 : 0;
  }
  return n;
}

// Blocking jobs run side by side (one slow server does not hold the next
// load up), but a tenant that blocks every one of them gets a bounded number
// of threads, and new work then waits only its own deadline.
TEST(DeadlineWorker, BlockedWorkTakesABoundedNumberOfThreads) {
  std::vector<std::unique_ptr<BlockingFifo>> fifos;
  {
    DeadlineWorker worker("test-bounded", 100ms);
    const int blockers = DeadlineWorker::kMaxStuck + DeadlineWorker::kMaxWorkers + 3;
    for (int i = 0; i < blockers; ++i) {
      fifos.push_back(std::make_unique<BlockingFifo>());
      BlockingFifo* f = fifos.back().get();
      EXPECT_FALSE(worker.Run([f] { f->Read(); }, 20ms, "a job that never ends"));
      std::this_thread::sleep_for(120ms);
    }
    EXPECT_EQ(worker.stats().stuck, static_cast<uint64_t>(DeadlineWorker::kMaxStuck));
    EXPECT_EQ(ThreadsNamed("test-bounded"), DeadlineWorker::kMaxStuck + DeadlineWorker::kMaxWorkers);
    const auto t0 = Clock::now();
    EXPECT_FALSE(worker.Run([] {}, 200ms, "a job behind them"));
    EXPECT_LT(Clock::now() - t0, 1s);
    // Free one blocked worker, and the blocking jobs still queued: the
    // queued work runs on that worker.
    fifos[DeadlineWorker::kMaxStuck]->Release();
    for (int i = DeadlineWorker::kMaxStuck + DeadlineWorker::kMaxWorkers; i < blockers; ++i) fifos[i]->Release();
    EXPECT_TRUE(worker.Run([] {}, 5000ms, "a job once one is free"));
  }  // the destructor does not wait for the blocked jobs: this returns
  for (auto& f : fifos) f->Release();
}

// An orderly end waits for work that ends soon (WaitIdle); work still held
// up when the worker is destroyed is counted as detached until it ends, so
// that main() knows not to run static destructors under it.
TEST(DeadlineWorker, WorkLeftRunningAtTheEndIsCountedUntilItEnds) {
  // The tests above release their blocked jobs as they end: those end now.
  auto settle = [] {
    const auto until = Clock::now() + 5s;
    while (DeadlineWorker::DetachedJobs() != 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  };
  settle();
  ASSERT_EQ(DeadlineWorker::DetachedJobs(), 0);
  BlockingFifo fifo;
  {
    DeadlineWorker worker("test-detached");
    EXPECT_TRUE(worker.WaitIdle(10ms));  // nothing ever ran
    EXPECT_FALSE(worker.Run([&fifo] { fifo.Read(); }, 20ms, "a job held up"));
    const auto t0 = Clock::now();
    EXPECT_FALSE(worker.WaitIdle(200ms));
    EXPECT_GE(Clock::now() - t0, 200ms);
    EXPECT_EQ(DeadlineWorker::DetachedJobs(), 0);  // its worker is still there
  }
  EXPECT_EQ(DeadlineWorker::DetachedJobs(), 1);
  fifo.Release();
  settle();
  EXPECT_EQ(DeadlineWorker::DetachedJobs(), 0);

  DeadlineWorker worker("test-detached");
  BlockingFifo second;
  EXPECT_FALSE(worker.Run([&second] { second.Read(); }, 20ms, "a job held up briefly"));
  std::thread release([&second] {
    std::this_thread::sleep_for(100ms);
    second.Release();
  });
  EXPECT_TRUE(worker.WaitIdle(5000ms));
  release.join();
}

}  // namespace
}  // namespace tlsprof::guard
