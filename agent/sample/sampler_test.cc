// Needs no privileges: CPU-list parsing, and the option checks that Start()
// makes before it touches the kernel.
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/sample/cpu_list.h"
#include "agent/sample/sampler.h"

namespace tlsprof::sample {
namespace {

using ::testing::HasSubstr;

TEST(CpuListTest, ParsesRangesAndSingles) {
  auto cpus = ParseCpuList("0-3,5,7-8\n");
  ASSERT_TRUE(cpus.ok()) << cpus.error().message;
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 5, 7, 8}));
}

TEST(CpuListTest, SingleCpu) {
  auto cpus = ParseCpuList("0\n");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, std::vector<int>{0});
}

TEST(CpuListTest, OfflineCpusAreSkipped) {
  // CPU 1 offline: the online file has a gap.
  auto cpus = ParseCpuList("0,2-3");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 2, 3}));
}

TEST(CpuListTest, SortsAndDeduplicates) {
  auto cpus = ParseCpuList("3,1-2,2");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{1, 2, 3}));
}

TEST(CpuListTest, RejectsMalformed) {
  for (const char* bad : {"", "\n", "a", "1-", "-1", "3-1", "1,,2", "1,", "0-1x", "99999999999"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << "accepted '" << bad << "'";
  }
}

TEST(CpuListTest, ReadsTheOnlineCpus) {
  auto cpus = ReadCpuList();
  ASSERT_TRUE(cpus.ok()) << cpus.error().message;
  EXPECT_FALSE(cpus->empty());
  EXPECT_EQ(static_cast<long>(cpus->size()), sysconf(_SC_NPROCESSORS_ONLN));
}

TEST(CpuListTest, MissingFileIsAnError) {
  auto cpus = ReadCpuList("/nonexistent/cpu/online");
  ASSERT_FALSE(cpus.ok());
  EXPECT_THAT(cpus.error().message, HasSubstr("/nonexistent/cpu/online"));
}

TEST(SamplerOptionsTest, RejectsFrequencyOutOfRange) {
  for (uint32_t hz : {0u, 10001u, 1000000u}) {
    auto sampler = Sampler::Start({.frequency_hz = hz, .target_pids = {}});
    ASSERT_FALSE(sampler.ok()) << hz << " Hz accepted";
    EXPECT_THAT(sampler.error().message, HasSubstr("1..10000 Hz")) << sampler.error().message;
  }
}

pid_t PidAbovePidMax() {
  std::ifstream in("/proc/sys/kernel/pid_max");
  long pid_max = 0;
  in >> pid_max;
  EXPECT_GT(pid_max, 0);
  return static_cast<pid_t>(pid_max + 1);  // never allocated
}

TEST(SamplerOptionsTest, RejectsNonexistentPid) {
  pid_t pid = PidAbovePidMax();
  auto sampler = Sampler::Start({.frequency_hz = 999, .target_pids = {pid}});
  ASSERT_FALSE(sampler.ok());
  EXPECT_THAT(sampler.error().message, HasSubstr("does not exist")) << sampler.error().message;
  EXPECT_THAT(sampler.error().message, HasSubstr(std::to_string(pid)));
}

TEST(SamplerOptionsTest, RejectsInvalidPid) {
  for (pid_t pid : {0, -1}) {
    auto sampler = Sampler::Start({.frequency_hz = 999, .target_pids = {pid}});
    ASSERT_FALSE(sampler.ok());
    EXPECT_THAT(sampler.error().message, HasSubstr("not a valid process id"));
  }
}

TEST(SamplerOptionsTest, RejectsThreadId) {
  // The filter is by tgid; a thread id would silently match nothing.
  std::promise<pid_t> tid;
  std::promise<void> done;
  std::thread thread([&] {
    tid.set_value(static_cast<pid_t>(syscall(SYS_gettid)));
    done.get_future().wait();
  });
  pid_t thread_id = tid.get_future().get();
  auto sampler = Sampler::Start({.frequency_hz = 999, .target_pids = {thread_id}});
  done.set_value();
  thread.join();
  ASSERT_FALSE(sampler.ok());
  EXPECT_THAT(sampler.error().message, HasSubstr(fmt::format("thread of process {}", getpid())));
}

}  // namespace
}  // namespace tlsprof::sample
