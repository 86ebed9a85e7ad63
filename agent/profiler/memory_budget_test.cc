// MemoryBudget (agent/guard/memory_budget.h) against this process's real
// resident memory, and the window reserve of sample::WindowMemoryBound.
#include "agent/guard/memory_budget.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "agent/sample/sampler.h"
#include "common/sanitizer.h"

namespace tlsprof {
namespace {

using guard::MemoryBudget;
constexpr uint64_t kMiB = 1 << 20;

TEST(MemoryBudget, NoLimitAdmitsEverything) {
  MemoryBudget budget;
  EXPECT_FALSE(budget.limited());
  EXPECT_TRUE(budget.Admit(uint64_t{1} << 50));
}

TEST(MemoryBudget, AdmitsWhatFitsUnderTheLimitNow) {
  const uint64_t resident = MemoryBudget::ResidentBytes();
  ASSERT_GT(resident, 0u);
  MemoryBudget budget(resident + 64 * kMiB, 16 * kMiB);
  EXPECT_TRUE(budget.Admit(8 * kMiB));
  EXPECT_FALSE(budget.Admit(64 * kMiB));  // with the reserve it does not fit
  // Resident memory counts: touching 40 MiB more leaves no room for 16 more.
  auto block = std::make_unique<char[]>(40 * kMiB);
  std::memset(block.get(), 1, 40 * kMiB);
  EXPECT_FALSE(budget.Admit(16 * kMiB));
  block.reset();
  // Freed (and trimmed by Admit), it fits again. Not under ASan: its allocator
  // keeps freed blocks in quarantine, and malloc_trim does not reach them.
  if (!kAddressSanitizer) {
    EXPECT_TRUE(budget.Admit(16 * kMiB));
  } else {
    std::printf("ASan build: freed memory stays in ASan's quarantine; the re-admission check is not made\n");
  }
}

TEST(MemoryBudget, BelowTheResidentSizeNothingFits) {
  MemoryBudget budget(MemoryBudget::ResidentBytes() / 2);
  EXPECT_FALSE(budget.Admit(0));
  budget.Skipped(MemoryBudget::kImage, "/usr/bin/example", 1);
  budget.Skipped(MemoryBudget::kImage, "/usr/bin/example", 1);
  budget.Skipped(MemoryBudget::kUnwindTable, "/usr/bin/example", 1);
  EXPECT_EQ(budget.skipped(MemoryBudget::kImage), 2u);
  EXPECT_EQ(budget.skipped(MemoryBudget::kUnwindTable), 1u);
}

TEST(WindowMemoryBound, GrowsWithEachMapAndStacksDominate) {
  const uint64_t defaults =
      sample::WindowMemoryBound(TLSPROF_MAX_PIDS, TLSPROF_MAX_SAMPLE_KEYS, TLSPROF_MAX_STACK_KEYS);
  const uint64_t fewer_stacks = sample::WindowMemoryBound(TLSPROF_MAX_PIDS, TLSPROF_MAX_SAMPLE_KEYS, 1024);
  EXPECT_LT(fewer_stacks, defaults);
  // A stack key is 264 bytes: a full window's drained set holds more than
  // 512 B per entry while its vector grows.
  EXPECT_GT(defaults - fewer_stacks, uint64_t{TLSPROF_MAX_STACK_KEYS - 1024} * 512);
  EXPECT_LT(sample::WindowMemoryBound(1, 1, 1), defaults);
  EXPECT_EQ(sample::WindowMemoryBound(0, 0, 0), 0u);
}

}  // namespace
}  // namespace tlsprof
