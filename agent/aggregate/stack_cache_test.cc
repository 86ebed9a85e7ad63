// StackCache: its keys, its bounds, and that keeping verdicts across windows
// changes nothing an Attribution says (the same stacks attributed with and
// without the cache, window after window, over this process's own
// libcrypto.so.3).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <random>
#include <vector>

#include "agent/aggregate/attribution.h"

namespace tlsprof::aggregate {
namespace {

using Verdict = Attributor::StackVerdict;

TEST(StackCache, KeysTellProcessesSnapshotsAndStacksApart) {
  const std::vector<uint64_t> a = {1, 2, 3}, b = {1, 2, 4}, prefix = {1, 2}, padded = {1, 2, 0};
  const StackCache::Key k = StackCache::KeyOf(7, 1, a);
  EXPECT_EQ(k, StackCache::KeyOf(7, 1, a));
  EXPECT_NE(k, StackCache::KeyOf(8, 1, a));
  EXPECT_NE(k, StackCache::KeyOf(7, 2, a));
  EXPECT_NE(k, StackCache::KeyOf(7, 1, b));
  EXPECT_NE(StackCache::KeyOf(7, 1, prefix), StackCache::KeyOf(7, 1, padded));
  EXPECT_NE(k.hash[0], k.hash[1]);
}

TEST(StackCache, VerdictsUnusedForIdleWindowsGo) {
  StackCache cache;
  const std::vector<uint64_t> used = {1}, idle = {2};
  Verdict v;
  v.kind = Verdict::Kind::kSyscallReturn;
  cache.Insert(StackCache::KeyOf(1, 1, used), v);
  cache.Insert(StackCache::KeyOf(1, 1, idle), v);
  for (uint64_t w = 0; w <= StackCache::kIdleWindows; ++w) {
    cache.NextWindow();
    ASSERT_NE(cache.Find(StackCache::KeyOf(1, 1, used)), nullptr);
  }
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Find(StackCache::KeyOf(1, 1, idle)), nullptr);
  const Verdict* kept = cache.Find(StackCache::KeyOf(1, 1, used));
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->kind, Verdict::Kind::kSyscallReturn);
  EXPECT_EQ(cache.hits(), StackCache::kIdleWindows + 2);
  EXPECT_EQ(cache.misses(), 1u);
}

TEST(StackCache, HoldsAtMostMaxEntries) {
  StackCache cache;
  for (uint64_t i = 0; i < StackCache::kMaxEntries + 10; ++i) {
    const std::vector<uint64_t> stack = {i};
    Verdict v;
    v.callee_site = i;
    // A verdict past the bound is still answered, not kept.
    EXPECT_EQ(cache.Insert(StackCache::KeyOf(1, 1, stack), v).callee_site, i);
  }
  EXPECT_EQ(cache.size(), StackCache::kMaxEntries);
  const std::string_view name = cache.Intern("[libssl.so.3]");
  EXPECT_EQ(name.data(), cache.Intern("[libssl.so.3]").data());
}

// Addresses inside libcrypto's exported functions: leaves, and return
// addresses of calls made from inside them.
std::vector<uint64_t> CryptoAddresses() {
  std::vector<uint64_t> out;
  for (const char* name :
       {"EVP_EncryptUpdate", "EVP_DecryptUpdate", "EVP_DigestUpdate", "EVP_DigestSignFinal", "EVP_PKEY_sign",
        "EVP_PKEY_derive", "RAND_bytes", "BN_mod_exp", "SHA256_Update", "EVP_CipherInit_ex"}) {
    void* f = dlsym(RTLD_DEFAULT, name);
    if (f == nullptr) continue;
    for (uint64_t offset : {5, 17, 40}) out.push_back(reinterpret_cast<uint64_t>(f) + offset);
  }
  return out;
}

// `stacks`: also the lists of stacks (an Attributor without keep_stacks has none).
void ExpectSame(const Attribution& a, const Attribution& b, bool stacks = true) {
  EXPECT_EQ(a.crypto.tls, b.crypto.tls);
  EXPECT_EQ(a.crypto.buckets, b.crypto.buckets);
  EXPECT_EQ(a.crypto.phases, b.crypto.phases);
  EXPECT_EQ(a.crypto.algorithms, b.crypto.algorithms);
  EXPECT_EQ(a.crypto.library_algorithms, b.crypto.library_algorithms);
  EXPECT_EQ(a.stack_samples, b.stack_samples);
  EXPECT_EQ(a.syscall_return_samples, b.syscall_return_samples);
  ASSERT_EQ(a.stacks.size(), stacks ? b.stacks.size() : a.stacks.size());
  for (size_t i = 0; stacks && i < a.stacks.size(); ++i) {
    EXPECT_EQ(a.stacks[i].frames, b.stacks[i].frames);
    EXPECT_EQ(a.stacks[i].classification.bucket, b.stacks[i].classification.bucket);
    EXPECT_EQ(a.stacks[i].classification.algorithm, b.stacks[i].classification.algorithm);
    EXPECT_EQ(a.stacks[i].phase, b.stacks[i].phase);
    EXPECT_EQ(a.stacks[i].samples, b.stacks[i].samples);
  }
  for (const auto& [pid, p] : a.processes) {
    ASSERT_TRUE(b.processes.contains(pid));
    const ProcessAttribution& q = b.processes.at(pid);
    EXPECT_EQ(p.inferred_from_operation, q.inferred_from_operation);
    EXPECT_EQ(p.inferred_from_process, q.inferred_from_process);
    ASSERT_EQ(p.symbols.size(), q.symbols.size());
    for (size_t i = 0; i < p.symbols.size(); ++i) EXPECT_EQ(p.symbols[i].samples, q.symbols[i].samples);
  }
}

// And the same counts without the list of stacks (the daemon's windows).
TEST(StackCache, AttributionIsTheSameWithAndWithoutIt) {
  // The test links libcrypto; make sure the library is mapped before the snapshot.
  EVP_MD_CTX_free(EVP_MD_CTX_new());
  discovery::ProcessRegistry registry;
  ASSERT_TRUE(registry.Refresh(getpid()).ok());
  const std::vector<uint64_t> addresses = CryptoAddresses();
  ASSERT_GE(addresses.size(), 12u) << "libcrypto's functions were not found";
  const auto tgid = static_cast<uint32_t>(getpid());

  // Stacks of 2 to 8 frames drawn from the addresses; each window takes a
  // random part of them, so verdicts are made, kept, reused and dropped.
  std::mt19937_64 rng(20261205);
  std::vector<std::vector<uint64_t>> stacks(300);
  for (auto& s : stacks) {
    s.resize(2 + rng() % 7);
    for (uint64_t& ip : s) ip = addresses[rng() % addresses.size()];
  }
  StackCache cache, counts_cache;
  for (int window = 0; window < 20; ++window) {
    cache.NextWindow();
    counts_cache.NextWindow();
    Attributor plain(registry), cached(registry, &cache), counts(registry, &counts_cache, /*keep_stacks=*/false);
    const auto all = {&plain, &cached, &counts};
    for (Attributor* a : all) a->AddProcess(tgid, 10000, 100);
    std::mt19937_64 pick(static_cast<uint64_t>(window));
    for (const auto& s : stacks) {
      if (pick() % 3 == 0) continue;
      const uint64_t count = 1 + pick() % 5;
      for (Attributor* a : all) a->AddStack(tgid, s, count);
    }
    for (uint64_t ip : addresses) {
      for (Attributor* a : all) a->AddUserSamples(tgid, ip, 7);
    }
    for (Attributor* a : all) a->SetScopeSamples(10100);
    const Attribution p = plain.Finish(), c = cached.Finish(), n = counts.Finish();
    ASSERT_GT(p.crypto.tls, 0u);
    ASSERT_FALSE(p.stacks.empty());
    ExpectSame(p, c);
    ExpectSame(p, n, /*stacks=*/false);
    EXPECT_TRUE(n.stacks.empty());
  }
  EXPECT_GT(cache.hits(), cache.misses());
}

}  // namespace
}  // namespace tlsprof::aggregate
