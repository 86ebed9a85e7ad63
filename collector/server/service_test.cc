#include "collector/server/service.h"

#include <gtest/gtest.h>

#include <thread>

#include "collector/server/memory_budget.h"

namespace tlsprof::collector {
namespace {

TEST(AllowList, ExactPrefixCommentsAndBlanks) {
  AllowList list = AllowList::FromLines({"# agents", "", "  web-1  ", "db-*", "tlsprof-loadgen\r"});
  EXPECT_EQ(list.size(), 3u);
  EXPECT_TRUE(list.Allows("web-1"));
  EXPECT_FALSE(list.Allows("web-10"));
  EXPECT_FALSE(list.Allows("web"));
  EXPECT_TRUE(list.Allows("db-"));
  EXPECT_TRUE(list.Allows("db-eu-3"));
  EXPECT_FALSE(list.Allows("xdb-1"));
  EXPECT_TRUE(list.Allows("tlsprof-loadgen"));
  EXPECT_FALSE(list.Allows("# agents"));
}

TEST(AllowList, MissingFileNamesIt) {
  Result<AllowList> list = AllowList::Load("/nonexistent/allowed");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.error().message.find("/nonexistent/allowed"), std::string::npos);
}

TEST(MemoryBudget, ReservationsWaitForRoomThenGiveUp) {
  using std::chrono::milliseconds;
  MemoryBudget budget(100);
  std::optional<MemoryBudget::Reservation> a = budget.Reserve(80, milliseconds(0));
  ASSERT_TRUE(a);
  EXPECT_FALSE(budget.Reserve(30, milliseconds(20)));  // 110 > 100: refused after the wait
  std::optional<MemoryBudget::Reservation> b = budget.Reserve(20, milliseconds(0));
  ASSERT_TRUE(b);
  EXPECT_EQ(budget.in_use(), 100u);
  // A waiter gets its room when a read shrinks another's reservation.
  std::thread shrink([&] {
    std::this_thread::sleep_for(milliseconds(50));
    a->ShrinkTo(10);
  });
  std::optional<MemoryBudget::Reservation> c = budget.Reserve(60, milliseconds(5000));
  shrink.join();
  ASSERT_TRUE(c);
  EXPECT_EQ(budget.in_use(), 90u);
  a.reset();
  b.reset();
  c.reset();
  EXPECT_EQ(budget.in_use(), 0u);
  // With nothing held, one reservation above the limit still fits.
  EXPECT_TRUE(budget.Reserve(1000, milliseconds(0)));
}

}  // namespace
}  // namespace tlsprof::collector
