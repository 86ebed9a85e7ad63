#include "collector/ingest/agent_state.h"

#include <algorithm>

namespace tlsprof::collector {

SequenceWindow::Check SequenceWindow::Test(uint64_t sequence) const {
  if (sequence > highest_) return Check::kNew;
  const uint64_t distance = highest_ - sequence;
  if (distance >= kWidth) return Check::kTooOld;
  return seen_.test(distance) ? Check::kDuplicate : Check::kNew;
}

void SequenceWindow::Mark(uint64_t sequence) {
  if (sequence > highest_) {
    const uint64_t shift = sequence - highest_;
    if (shift >= kWidth) {
      seen_.reset();
    } else {
      seen_ <<= shift;
    }
    highest_ = sequence;
    seen_.set(0);
    return;
  }
  const uint64_t distance = highest_ - sequence;
  if (distance < kWidth) seen_.set(distance);
}

std::vector<uint64_t> SequenceWindow::Words() const {
  std::vector<uint64_t> words(kWidth / 64, 0);
  for (uint64_t i = 0; i < kWidth; ++i) {
    if (seen_.test(i)) words[i / 64] |= uint64_t{1} << (i % 64);
  }
  return words;
}

SequenceWindow SequenceWindow::FromWords(uint64_t highest, const std::vector<uint64_t>& words) {
  SequenceWindow w;
  w.highest_ = highest;
  for (uint64_t i = 0; i < kWidth && i / 64 < words.size(); ++i) {
    if (words[i / 64] & (uint64_t{1} << (i % 64))) w.seen_.set(i);
  }
  return w;
}

bool TokenBucket::Take(int64_t now_ns, double rate, double burst) {
  if (!started_) {
    started_ = true;
    tokens_ = burst;
    last_ns_ = now_ns;
  }
  if (now_ns > last_ns_) {
    tokens_ = std::min(burst, tokens_ + rate * static_cast<double>(now_ns - last_ns_) / 1e9);
    last_ns_ = now_ns;
  }
  if (tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

}  // namespace tlsprof::collector
