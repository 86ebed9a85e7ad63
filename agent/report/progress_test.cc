#include "agent/report/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace tlsprof::report {
namespace {

using namespace std::chrono_literals;

// What was written to `file` so far.
std::string Written(std::FILE* file) {
  std::fflush(file);
  std::string text(static_cast<size_t>(std::ftell(file)), '\0');
  std::rewind(file);
  text.resize(std::fread(text.data(), 1, text.size(), file));
  std::fseek(file, 0, SEEK_END);
  return text;
}

TEST(Countdown, RewritesOneLineOnlyWhenTheSecondsLeftChange) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    Countdown countdown(file, true);
    countdown.Show(10s);
    countdown.Show(9.5s);  // rounds up to 10: nothing new
    countdown.Show(8.2s);
    EXPECT_EQ(Written(file), "\rsampling 10 s left...\rsampling 9 s left... ");
    countdown.Show(0s);
    EXPECT_EQ(Written(file).substr(44), "\r" + std::string(20, ' ') + "\r");
  }
  // Cleared already: the destructor adds nothing.
  EXPECT_EQ(Written(file).size(), 44u + 22u);
  std::fclose(file);
}

TEST(Countdown, ClearsItsLineWhenItGoes) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  { Countdown(file, true).Show(3s); }
  EXPECT_EQ(Written(file), "\rsampling 3 s left...\r" + std::string(20, ' ') + "\r");
  std::fclose(file);
}

TEST(Countdown, WritesNothingWhenNotOnATerminal) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    Countdown countdown(file, false);
    countdown.Show(5s);
    countdown.Show(0s);
  }
  EXPECT_EQ(Written(file), "");
  std::fclose(file);
}

}  // namespace
}  // namespace tlsprof::report
