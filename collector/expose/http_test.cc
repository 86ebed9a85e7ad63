#include "collector/expose/http.h"

#include <gtest/gtest.h>

namespace tlsprof::collector {
namespace {

TEST(SummaryMinutes, DefaultRangeAndErrors) {
  EXPECT_EQ(*ParseSummaryMinutes(nullptr), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes(""), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes("other=3"), kDefaultSummaryMinutes);
  EXPECT_EQ(*ParseSummaryMinutes("minutes=1"), 1);
  EXPECT_EQ(*ParseSummaryMinutes("x=1&minutes=60"), 60);
  for (const char* bad : {"minutes=0", "minutes=61", "minutes=-5", "minutes=5x", "minutes=", "minutes=1e1"}) {
    Result<int> r = ParseSummaryMinutes(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("minutes: must be an integer 1-60"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace tlsprof::collector
