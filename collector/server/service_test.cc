#include "collector/server/service.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tlsprof::collector
