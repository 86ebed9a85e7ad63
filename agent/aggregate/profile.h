// Attribution and aggregation: turns the sampler's per-(process, IP) counts
// into CPU time per process, bucket and algorithm.
//
// Leaf-only semantics (docs/attribution.md): a sample is TLS time when its
// user IP lies in TLS library code — anywhere in a shared libssl/libcrypto, or
// inside a TLS symbol of a binary that links the library statically (node, Go,
// static OpenSSL). Its bucket and algorithm come from that symbol through the
// rules table; unnamed code of a shared TLS library is {other, unknown}.
// Not thread-safe: one thread owns an Attributor.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/classify/classify.h"
#include "agent/discovery/process_registry.h"

namespace tlsprof::aggregate {

using AlgorithmKey = std::pair<classify::Bucket, std::string_view>;  // algorithm names are static strings

struct CryptoTime {
  uint64_t tls = 0;  // samples in TLS library code
  std::array<uint64_t, classify::kBucketCount> buckets{};
  std::map<AlgorithmKey, uint64_t> algorithms;

  void Add(const classify::Classification& c, uint64_t count);
  void Merge(const CryptoTime& other);
};

struct LibraryUse {
  const discovery::ImageInfo* image = nullptr;
  uint64_t tls_samples = 0;    // TLS samples inside this file
  uint64_t named_samples = 0;  // of those, how many fell inside a named symbol
};

// Samples that fell in one TLS symbol (or in unnamed code of one library).
struct SymbolKey {
  const discovery::ImageInfo* image = nullptr;
  int64_t symbol = -1;  // index into image->image->symbols, -1 = unnamed
  auto operator<=>(const SymbolKey&) const = default;
};
struct SymbolCount {
  classify::Classification classification;
  uint64_t samples = 0;
};

struct ProcessProfile {
  pid_t pid = 0;
  std::string comm;
  uint64_t samples = 0;  // user + kernel: the process's busy CPU
  uint64_t kernel_samples = 0;
  CryptoTime crypto;
  std::vector<LibraryUse> libraries;         // the TLS libraries it maps (with or without samples)
  std::map<SymbolKey, SymbolCount> symbols;  // where its TLS samples fell, for the report's top symbols
};

struct Profile {
  uint64_t scope_samples = 0;  // busy CPU of the scope (host or --pid set)
  CryptoTime crypto;
  std::map<pid_t, ProcessProfile> processes;  // only processes with samples
  uint64_t unresolved_samples = 0;            // user IPs in processes the agent could not snapshot
};

class Attributor {
 public:
  explicit Attributor(const discovery::ProcessRegistry& registry) : registry_(registry) {}

  // Busy CPU of one process (from samples_by_pid).
  void AddProcess(uint32_t tgid, uint64_t user_samples, uint64_t kernel_samples);
  // User-mode samples at one IP (from samples_by_ip).
  void AddUserSamples(uint32_t tgid, uint64_t ip, uint64_t count);
  // The scope's busy CPU; for the host this is all non-idle samples, which
  // includes processes whose pid entry could not be stored.
  void SetScopeSamples(uint64_t samples) { profile_.scope_samples = samples; }

  Profile Finish();

  // Classifies one user IP of a process. nullopt: not TLS library code.
  // `where` tells in which image and symbol the IP fell.
  std::optional<classify::Classification> Classify(const discovery::ProcessSnapshot& process, uint64_t ip,
                                                   SymbolKey* where);

 private:
  ProcessProfile& Process(uint32_t tgid);

  const discovery::ProcessRegistry& registry_;
  Profile profile_;
  // (image, symbol index) → classification; symbols are classified once.
  std::map<std::pair<const symbols::BinaryImage*, uint32_t>, std::optional<classify::Classification>> cache_;
};

}  // namespace tlsprof::aggregate
