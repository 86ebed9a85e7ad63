// FollowChain: a LoadChain read through this process's own memory, as the
// BPF walk (bpf/usage.bpf.c, read_field) reads it through the profiled
// process's, for the tests that check decoded chains against live library
// objects (usage_test, boringssl_plan_test). Header-only; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

#include "agent/usage/accessors.h"

namespace tlsprof::usage {

// The field's value, bit field applied; nullopt where a pointer on the way
// is NULL or the type guard fails (the walk's USAGE_UNKNOWN).
inline std::optional<uint64_t> FollowChain(const void* base, const LoadChain& chain) {
  const char* p = static_cast<const char*>(base);
  if (chain.type_guard) {
    uint32_t type = 1;
    if (!p) return std::nullopt;
    std::memcpy(&type, p, sizeof(type));
    if (type != 0) return std::nullopt;
  }
  for (size_t i = 0; i < chain.offsets.size(); ++i) {
    if (!p) return std::nullopt;
    const char* at = p + chain.offsets[i];
    if (i + 1 < chain.offsets.size()) {
      std::memcpy(&p, at, sizeof(p));
      continue;
    }
    uint64_t v = 0;
    std::memcpy(&v, at, chain.width);
    if (chain.shift || chain.bits) {
      v >>= chain.shift;
      if (chain.bits) v &= (1ull << chain.bits) - 1;
    }
    if (chain.invert) v = !v;
    return v;
  }
  return std::nullopt;
}

}  // namespace tlsprof::usage
