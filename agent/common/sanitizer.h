// Whether this build is instrumented by AddressSanitizer: the ASan + UBSan build of the test suite
// (-DTLSPROF_SANITIZE=ON, scripts/test-sanitizers.sh) and the libFuzzer build (-DTLSPROF_FUZZ=ON).
#pragma once

namespace tlsprof {

#if defined(__SANITIZE_ADDRESS__)  // gcc
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Tests' CPU-time budgets are the release build's. Under ASan every load and store is checked, and the
// allocator keeps redzones and a quarantine: the classification tests measured 1.2x-5x slower than their
// budget on the loaded 2-vCPU CI machine. Such a test asserts budget * kSanitizerTimeFactor there, and says so.
inline constexpr double kSanitizerTimeFactor = kAddressSanitizer ? 10.0 : 1.0;

}  // namespace tlsprof
