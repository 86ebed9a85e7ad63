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
// allocator keeps redzones and a quarantine: CPU-bound tests run several times over their release
// budget. Such a test asserts budget * kSanitizerTimeFactor there, and says so.
inline constexpr double kSanitizerTimeFactor = kAddressSanitizer ? 10.0 : 1.0;

// The agent's default --memory-limit is the release build's 512 MiB times this. Under ASan the resident
// size is mostly ASan's own: the allocator's quarantine (256 MiB by default) of freed blocks, shadow memory
// and allocation stacks. Measured on the idle CI machine: 323 MiB after 12 s of `tlsprof-agent run`, 380 MiB
// beside a 70-process host (the release build: 25 MiB). At 512 MiB the default cap would bind in every test
// and refuse the loads whose code the sanitizer pass is there to check. An explicit --memory-limit is taken
// as given (test_bounds prints, rather than asserts, what depends on the absolute resident size).
inline constexpr unsigned kSanitizerMemoryFactor = kAddressSanitizer ? 8 : 1;

}  // namespace tlsprof
