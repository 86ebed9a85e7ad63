#include "agent/ship/collectors.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/placement/rendezvous.h"

namespace tlsprof::ship {
namespace {

struct HostPort {
  std::string host;  // without brackets
  std::string port;
  bool literal_v6 = false;
};

Result<HostPort> SplitHostPort(const std::string& entry) {
  HostPort hp;
  std::string rest;
  if (entry.starts_with("[")) {
    size_t close = entry.find(']');
    if (close == std::string::npos || close + 1 >= entry.size() || entry[close + 1] != ':') {
      return MakeError("--collector {}: expected [IPV6]:PORT", entry);
    }
    hp.host = entry.substr(1, close - 1);
    hp.port = entry.substr(close + 2);
    hp.literal_v6 = true;
  } else {
    size_t colon = entry.rfind(':');
    if (colon == std::string::npos || colon == 0) return MakeError("--collector {}: expected HOST:PORT", entry);
    hp.host = entry.substr(0, colon);
    hp.port = entry.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) {
      return MakeError("--collector {}: an IPv6 address goes in brackets, [ADDRESS]:PORT", entry);
    }
  }
  if (hp.port.empty() || hp.port.size() > 5 || !std::all_of(hp.port.begin(), hp.port.end(), ::isdigit) ||
      std::stoul(hp.port) == 0 || std::stoul(hp.port) > 65535) {
    return MakeError("--collector {}: the port must be a number from 1 to 65535", entry);
  }
  if (hp.host.empty()) return MakeError("--collector {}: no host", entry);
  return hp;
}

bool IsAddressLiteral(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

std::vector<std::string> ResolveWithGetaddrinfo(const std::string& host) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  std::vector<std::string> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return out;
  for (auto* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr = ai->ai_family == AF_INET
                           ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr)
                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
        ::inet_ntop(ai->ai_family, addr, text, sizeof text) != nullptr) {
      out.emplace_back(text);
    }
  }
  ::freeaddrinfo(result);
  return out;
}

Result<std::vector<CollectorTarget>> ExpandCollectors(const std::vector<std::string>& entries,
                                                      const Resolver& resolve) {
  if (entries.empty()) return MakeError("no collector address given (HOST:PORT)");
  std::vector<CollectorTarget> targets;
  std::set<std::string> seen;
  auto add = [&](CollectorTarget t) {
    if (seen.insert(t.address).second) targets.push_back(std::move(t));
  };
  for (const std::string& entry : entries) {
    auto hp = SplitHostPort(entry);
    if (!hp) return hp.error();
    if (hp->literal_v6 || IsAddressLiteral(hp->host)) {
      add({entry, "", entry});
      continue;
    }
    std::vector<std::string> v4, v6;
    for (const std::string& a : resolve(hp->host)) (a.find(':') == std::string::npos ? v4 : v6).push_back(a);
    const std::vector<std::string>& family = v4.empty() ? v6 : v4;
    std::set<std::string> unique(family.begin(), family.end());
    if (unique.size() < 2) {
      add({entry, "", entry});
      continue;
    }
    for (const std::string& a : unique) {
      std::string address =
          v4.empty() ? fmt::format("ipv6:[{}]:{}", a, hp->port) : fmt::format("ipv4:{}:{}", a, hp->port);
      add({address, hp->host, entry});
    }
  }
  return targets;
}

std::vector<CollectorTarget> PreferenceOrder(const std::string& identity, std::vector<CollectorTarget> targets) {
  std::vector<std::string> addresses;
  for (const auto& t : targets) addresses.push_back(t.address);
  std::vector<CollectorTarget> ordered;
  for (size_t i : placement::RendezvousOrder(identity, addresses)) ordered.push_back(std::move(targets[i]));
  return ordered;
}

}  // namespace tlsprof::ship
