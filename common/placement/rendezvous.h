// Rendezvous (highest-random-weight) hashing: which collector an agent ships
// to (docs/fleet.md, "Several collectors").
//
// Every (key, target) pair gets a score from a fixed 64-bit hash; a key's
// order of preference is its targets by score, highest first. So each key has
// the same first choice on every host and in every run (the agent and the
// loadgen agree), keys spread evenly over the targets, and adding or removing
// one target moves only the keys whose first choice it is or becomes: about
// 1/N of them. The hash is FNV-1a with a SplitMix64 finalizer, fixed here and
// never std::hash, whose values may differ between builds.
// Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace tlsprof::placement {

inline uint64_t Fnv1a64(uint64_t hash, std::string_view bytes) {
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The score of `target` for `key`. The NUL between them keeps ("ab", "c")
// and ("a", "bc") apart.
inline uint64_t RendezvousScore(std::string_view key, std::string_view target) {
  uint64_t h = Fnv1a64(0xcbf29ce484222325ull, key);
  h = Fnv1a64(h, std::string_view("\0", 1));
  h = Fnv1a64(h, target);
  // SplitMix64's finalizer: FNV alone leaves the high bits of similar
  // strings (collector-0, collector-1) correlated.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// Indices into `targets`, most preferred first. Ties (equal scores) keep the
// targets' order, so the result never depends on the sort's stability.
inline std::vector<size_t> RendezvousOrder(std::string_view key, const std::vector<std::string>& targets) {
  std::vector<uint64_t> scores(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) scores[i] = RendezvousScore(key, targets[i]);
  std::vector<size_t> order(targets.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a < b; });
  return order;
}

}  // namespace tlsprof::placement
