// Exports of a profile's TLS stacks for flame-graph tools:
//   folded stacks (flamegraph.pl, speedscope, inferno), one line per stack:
//     comm;[phase];[bucket algorithm];outermost;...;leaf count
//   pprof (go tool pprof, speedscope): a profile.proto with one sample per
//     stack, labels bucket/algorithm/phase/pid/comm, value = samples and
//     CPU nanoseconds.
// Only TLS samples that came with a user stack are exported. Pure functions.
#pragma once

#include <string>

#include "agent/aggregate/attribution.h"
#include "common/result.h"

namespace tlsprof::report {

std::string FoldedStacks(const aggregate::Attribution& profile);
// Serialized (uncompressed) pprof profile.proto bytes; the profile starts
// at `start_unix_ns` (the window's start) and lasts `duration_seconds`.
std::string PprofProfile(const aggregate::Attribution& profile, uint64_t period_ns, int64_t start_unix_ns,
                         double duration_seconds);

Status WriteFile(const std::string& path, const std::string& bytes);

}  // namespace tlsprof::report
