// The collectors an agent may ship to, and its order of preference among
// them (docs/fleet.md, "Several collectors").
//
// Each --collector entry is HOST:PORT. An entry whose host name resolves to
// several addresses (a headless Kubernetes Service, a DNS round robin) is one
// collector per address, of one family: the IPv4 ones when there are any,
// else the IPv6 ones (a dual-stack name lists each collector once per
// family). Those are dialled by address and their certificate is checked for
// the name. Any other entry is one collector, dialled by name (gRPC resolves
// it at each connect).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

namespace tlsprof::ship {

struct CollectorTarget {
  std::string address;   // what gRPC dials: the entry, or ipv4:A.B.C.D:PORT / ipv6:[…]:PORT
  std::string tls_name;  // the name the certificate must hold, when `address` is an address (else empty)
  std::string entry;     // the --collector entry it came from, for logs
};

// Resolves a host name to its addresses as text ("10.0.0.1", "fd00::1"): an
// empty list when it does not resolve. Tests pass their own.
using Resolver = std::function<std::vector<std::string>(const std::string& host)>;
std::vector<std::string> ResolveWithGetaddrinfo(const std::string& host);

// Checks every entry (HOST:PORT, [IPv6]:PORT) and expands the names with
// several addresses. Targets are unique by address; an entry repeated, or an
// address reached twice, counts once. A name that does not resolve now is
// kept as one collector: gRPC retries resolving it.
Result<std::vector<CollectorTarget>> ExpandCollectors(const std::vector<std::string>& entries,
                                                      const Resolver& resolve = ResolveWithGetaddrinfo);

// The targets in the agent's order of preference: rendezvous hashing of
// `identity` over the targets' addresses (common/placement/rendezvous.h).
std::vector<CollectorTarget> PreferenceOrder(const std::string& identity, std::vector<CollectorTarget> targets);

}  // namespace tlsprof::ship
