// SplitHandshakeCpu: a process's sampled TLS CPU of the handshake phase,
// split over its handshakes by kind, certificate key and group
// (docs/usage.md, "Cost per handshake").
//
// Sampling says how much CPU the handshakes of a process took, not which
// handshake took it. The probes do time the expensive part of each
// handshake: its signature (server, full), its verification (client,
// full) and its key exchange, on-CPU. So a handshake's cost is modelled as
// what its own operations cost (the mean of the process's in-handshake
// operations of that key and length) plus an equal share of the rest
// (record layer, hashing, the state machine, allocation). Exact for a
// process whose handshakes are all alike; the split for a mix is the model's.
// Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "agent/usage/usage_probes.h"

namespace tlsprof::usage {

struct HandshakeCost {
  double cpu_seconds = 0;  // of all the row's handshakes (the estimated count's)
};

// One cost per row of window.handshakes, in order. `handshake_tls_cpu(tgid)`
// is the process's sampled TLS CPU of the handshake phase in the window (s).
// Rows are weighed by their estimated count (the duty cycle's scaling).
std::vector<HandshakeCost> SplitHandshakeCpu(const UsageSnapshot& window,
                                             const std::function<double(uint32_t tgid)>& handshake_tls_cpu);

}  // namespace tlsprof::usage
