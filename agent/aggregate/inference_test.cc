// InferFromOperations: where a context's set-up names no algorithm (the
// implicit fetch, the free), its samples take what the same caller named
// through its other calls of the bucket, and the process's mix only when that
// caller named nothing. Stacks over this process's own libcrypto.so.3 (its
// exported functions) under callers in this test binary.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <string_view>
#include <vector>

#include "agent/aggregate/attribution.h"

namespace tlsprof::aggregate {
namespace {

// Three callers, as three functions of an application: one makes a fresh
// AES-GCM context per operation, one encrypts with a kept AES-CBC context,
// one only makes contexts. Distinct bodies, so that the linker folds none,
// each long enough for two call sites (this binary is no TLS code, so its
// frames have no names: the callers are told apart by .eh_frame_hdr).
#define TLSPROF_NOPS16 "nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop; nop"
extern "C" __attribute__((noinline)) int FreshGcmCaller(int x) {
  asm volatile(TLSPROF_NOPS16 : "+r"(x));
  return x * 3 + 1;
}
extern "C" __attribute__((noinline)) int KeptCbcCaller(int x) {
  asm volatile(TLSPROF_NOPS16 : "+r"(x));
  return x * 5 + 2;
}
extern "C" __attribute__((noinline)) int SetupOnlyCaller(int x) {
  asm volatile(TLSPROF_NOPS16 : "+r"(x));
  return x * 7 + 3;
}

uint64_t At(const char* name, uint64_t offset) {
  void* f = dlsym(RTLD_DEFAULT, name);
  return f == nullptr ? 0 : reinterpret_cast<uint64_t>(f) + offset;
}

// Return addresses in `f`: two call sites of one function.
uint64_t In(int (*f)(int), uint64_t offset = 4) { return reinterpret_cast<uint64_t>(f) + offset; }

uint64_t Samples(const ProcessAttribution& p, std::string_view algorithm) {
  uint64_t n = 0;
  for (const auto& [key, count] : p.crypto.algorithms) {
    if (key.bucket == classify::Bucket::kCipher && key.algorithm == algorithm) n += count;
  }
  return n;
}

class InferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EVP_CIPHER_CTX_free(EVP_CIPHER_CTX_new());  // libcrypto mapped before the snapshot
    ASSERT_TRUE(registry_.Refresh(getpid()).ok());
    gcm_ = At("CRYPTO_gcm128_encrypt", 5);
    cbc_ = At("AES_cbc_encrypt", 5);
    fetch_ = At("EVP_CIPHER_fetch", 5);
    update_ = At("EVP_EncryptUpdate", 17);
    init_ = At("EVP_CipherInit_ex", 17);
    for (uint64_t a : {gcm_, cbc_, fetch_, update_, init_}) ASSERT_NE(a, 0u) << "a libcrypto function is missing";
  }

  // GCM's bulk under FreshGcmCaller, CBC's (9 times as much) under
  // KeptCbcCaller, then `setup` samples of a context's set-up that name no
  // cipher under `caller`.
  ProcessAttribution Run(int (*caller)(int), uint64_t setup) {
    const auto tgid = static_cast<uint32_t>(getpid());
    Attributor a(registry_);
    a.AddProcess(tgid, 1000, 0);
    const uint64_t gcm_stack[] = {gcm_, update_, In(FreshGcmCaller)};
    const uint64_t cbc_stack[] = {cbc_, update_, In(KeptCbcCaller)};
    const uint64_t setup_stack[] = {fetch_, init_, In(caller, 12)};  // another call site of the caller
    a.AddStack(tgid, gcm_stack, 10);
    a.AddStack(tgid, cbc_stack, 90);
    a.AddStack(tgid, setup_stack, setup);
    Attribution out = a.Finish();
    return out.processes.at(static_cast<pid_t>(tgid));
  }

  discovery::ProcessRegistry registry_;
  uint64_t gcm_ = 0, cbc_ = 0, fetch_ = 0, update_ = 0, init_ = 0;
};

TEST_F(InferenceTest, NamedCiphersAreWhatTheRulesSay) {
  const ProcessAttribution p = Run(FreshGcmCaller, 0);
  EXPECT_EQ(Samples(p, classify::algo::kAesGcm), 10u);
  EXPECT_EQ(Samples(p, classify::algo::kAesCbc), 90u);
}

TEST_F(InferenceTest, SetUpTakesWhatItsCallerNamed) {
  // The fresh GCM context's fetch is GCM's, not 9/10 CBC's, though it was
  // called from another place in the caller than GCM's encryption.
  const ProcessAttribution p = Run(FreshGcmCaller, 40);
  EXPECT_EQ(Samples(p, classify::algo::kAesGcm), 50u);
  EXPECT_EQ(Samples(p, classify::algo::kAesCbc), 90u);
  EXPECT_EQ(Samples(p, classify::algo::kUnknown), 0u);
  EXPECT_EQ(p.inferred_from_process, 40u);
}

TEST_F(InferenceTest, SetUpOfACallerThatNamedNothingTakesTheProcessMix) {
  const ProcessAttribution p = Run(SetupOnlyCaller, 40);
  EXPECT_EQ(Samples(p, classify::algo::kAesGcm), 10u + 4u);
  EXPECT_EQ(Samples(p, classify::algo::kAesCbc), 90u + 36u);
  EXPECT_EQ(Samples(p, classify::algo::kUnknown), 0u);
}

}  // namespace
}  // namespace tlsprof::aggregate
