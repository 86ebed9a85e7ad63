// 64-bit integer mixing for the agent's own hash tables and keys (not
// cryptographic). Pure functions: thread-safe.
#pragma once

#include <cstdint>

namespace tlsprof {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
constexpr uint64_t Fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

}  // namespace tlsprof
