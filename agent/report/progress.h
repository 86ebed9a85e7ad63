// A one-line countdown on stderr while a window samples ("sampling 7 s
// left..."), rewritten in place with a carriage return and cleared when the
// window ends, so that a person at a terminal sees the run is alive. When
// stderr is not a terminal (a pipe, a log file, a test), it writes nothing:
// such readers want lines, not rewrites. The report itself goes to stdout
// and is never touched.
//
// Lifecycle: construct before the sampling loop, Show() on each turn of it;
// Show() with no time left, or the destructor, clears the line. Not
// thread-safe: one owner, the thread that samples.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdio>

namespace tlsprof::report {

class Countdown {
 public:
  // On stderr, shown only if it is a terminal.
  Countdown();
  // On `out`, shown if `enabled` (tests).
  Countdown(std::FILE* out, bool enabled);
  ~Countdown();
  Countdown(const Countdown&) = delete;
  Countdown& operator=(const Countdown&) = delete;

  // Shows the whole seconds left, rounded up; rewrites the line only when
  // that figure changes, so it may be called as often as the caller likes.
  // Nothing left (zero or less) clears the line.
  void Show(std::chrono::duration<double> left);
  // Erases the line, if one is shown.
  void Clear();

 private:
  void Write(const char* text, size_t length);

  std::FILE* out_;
  bool enabled_;
  long shown_ = -1;   // seconds on the line; -1: no line
  size_t width_ = 0;  // characters on the line, to blank them out
};

}  // namespace tlsprof::report
