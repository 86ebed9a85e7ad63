#include "agent/report/progress.h"

#include <unistd.h>

#include <cmath>
#include <string>

#include <fmt/format.h>

namespace tlsprof::report {

Countdown::Countdown() : Countdown(stderr, isatty(STDERR_FILENO) == 1) {}

Countdown::Countdown(std::FILE* out, bool enabled) : out_(out), enabled_(enabled) {}

Countdown::~Countdown() { Clear(); }

void Countdown::Show(std::chrono::duration<double> left) {
  if (!enabled_) return;
  if (left.count() <= 0) {
    Clear();
    return;
  }
  const long seconds = static_cast<long>(std::ceil(left.count()));
  if (seconds == shown_) return;
  // Blank out a longer previous line (10 s → 9 s) rather than rely on a
  // terminal's erase sequence, which a dumb terminal lacks.
  std::string text = fmt::format("sampling {} s left...", seconds);
  const size_t width = text.size();
  if (width < width_) text.append(width_ - width, ' ');
  text.insert(0, "\r");
  Write(text.data(), text.size());
  shown_ = seconds;
  width_ = width;
}

void Countdown::Clear() {
  if (!enabled_ || shown_ < 0) return;
  std::string text = "\r" + std::string(width_, ' ') + "\r";
  Write(text.data(), text.size());
  shown_ = -1;
  width_ = 0;
}

void Countdown::Write(const char* text, size_t length) {
  // Through the FILE, after anything the logger wrote to it, and flushed:
  // the line must show now, not when a buffer fills.
  std::fwrite(text, 1, length, out_);
  std::fflush(out_);
}

}  // namespace tlsprof::report
