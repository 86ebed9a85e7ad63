#include "agent/classify/classify.h"
#include <gtest/gtest.h>
TEST(Classify, Smoke) { EXPECT_TRUE(tlsprof::classify::IsTlsSymbol("SSL_read")); }
