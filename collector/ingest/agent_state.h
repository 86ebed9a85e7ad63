// Per-agent ingest state: which batches were accepted (SequenceWindow) and the
// rate limit (TokenBucket). Plain values, not thread-safe: the Ingestor
// guards them.
#pragma once

#include <bitset>
#include <cstdint>
#include <vector>

namespace tlsprof::collector {

// The batches of one agent instance that were accepted: the highest sequence
// plus a bitmap of the kWidth sequences below it (the anti-replay window of
// IPsec, RFC 4303 3.4.3). Agents ship their spool in order, so the window
// normally holds one run of ones; a batch that arrives late, above a gap, is
// still told apart. A sequence more than kWidth below the highest is treated
// as seen: at 10 s windows that is almost 3 hours late, and remembering every
// sequence forever would make the state grow without bound.
class SequenceWindow {
 public:
  static constexpr uint64_t kWidth = 1024;
  enum class Check { kNew, kDuplicate, kTooOld };

  Check Test(uint64_t sequence) const;
  // Records `sequence` as accepted (call after Test() said kNew).
  void Mark(uint64_t sequence);

  uint64_t highest() const { return highest_; }
  // The bitmap as kWidth/64 words, bit i of word w = sequence highest - (64w + i).
  std::vector<uint64_t> Words() const;
  static SequenceWindow FromWords(uint64_t highest, const std::vector<uint64_t>& words);

 private:
  uint64_t highest_ = 0;      // 0: nothing accepted yet (sequences start at 1)
  std::bitset<kWidth> seen_;  // bit i: highest_ - i was accepted
};

// Token bucket: `rate` tokens per second, at most `burst` stored. Starts full.
class TokenBucket {
 public:
  bool Take(int64_t now_ns, double rate, double burst);

 private:
  bool started_ = false;
  double tokens_ = 0;
  int64_t last_ns_ = 0;
};

}  // namespace tlsprof::collector
