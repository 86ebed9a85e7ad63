#include "collector/expose/fleet_api.h"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "collector/ingest/validate.h"

namespace tlsprof::collector {
namespace {

using BucketSeconds = std::array<double, 6>;  // by v1::Bucket

// The first minute of the last `minutes` at now_ns: a minute counts when it
// began within them.
int64_t FirstMinute(int minutes, int64_t now_ns) { return FloorDiv(now_ns, kNsPerMinute) - minutes + 1; }

// What the summary adds up over its minutes.
struct Totals {
  uint64_t reports = 0;
  std::unordered_set<uint64_t> agents;
  double busy = 0, tls = 0;
  BucketSeconds buckets{};
  std::map<std::pair<int, std::string>, double> algorithms;
};

Totals AddMinutes(const FleetState& s, int64_t first) {
  Totals t;
  for (auto it = s.minutes.lower_bound(first); it != s.minutes.end(); ++it) {
    const FleetState::Minute& m = *it->second;
    t.reports += m.reports;
    t.agents.insert(m.agents.begin(), m.agents.end());
    t.busy += m.busy_seconds;
    t.tls += m.tls_seconds;
    for (size_t i = 0; i < t.buckets.size(); ++i) t.buckets[i] += m.bucket_seconds[i];
    for (const auto& [key, seconds] : m.algorithms) t.algorithms[key] += seconds;
  }
  return t;
}

}  // namespace

nlohmann::json SummaryJson(const Ingestor& ingestor, int minutes, int64_t now_ns) {
  const Totals t = ingestor.Read([&](const FleetState& s) { return AddMinutes(s, FirstMinute(minutes, now_ns)); });
  auto share = [&t](double v) { return t.tls > 0 ? v / t.tls : 0.0; };
  nlohmann::json out = {{"minutes", minutes},        {"reports", t.reports},
                        {"agents", t.agents.size()}, {"busy_cpu_seconds", t.busy},
                        {"tls_cpu_seconds", t.tls},  {"tls_share", t.busy > 0 ? t.tls / t.busy : 0.0}};
  out["buckets"] = nlohmann::json::array();
  for (int b = v1::BUCKET_CIPHER; b <= v1::BUCKET_OTHER; ++b) {
    out["buckets"].push_back({{"bucket", BucketName(static_cast<v1::Bucket>(b))},
                              {"cpu_seconds", t.buckets[b]},
                              {"share_of_tls", share(t.buckets[b])}});
  }
  std::vector<std::pair<std::pair<int, std::string>, double>> sorted(t.algorithms.begin(), t.algorithms.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  out["algorithms"] = nlohmann::json::array();
  for (const auto& [key, seconds] : sorted) {
    out["algorithms"].push_back({{"bucket", BucketName(static_cast<v1::Bucket>(key.first))},
                                 {"algorithm", key.second},
                                 {"cpu_seconds", seconds},
                                 {"share_of_tls", share(seconds)}});
  }
  return out;
}

nlohmann::json TrendJson(const Ingestor& ingestor, int minutes, int64_t now_ns) {
  // The summary's minutes, not filled in: a minute without reports has no
  // share, and a zero would read as "no TLS".
  struct Point {
    int64_t minute;
    uint64_t reports;
    size_t agents;
    double busy, tls;
    BucketSeconds buckets;
  };
  const std::vector<Point> points = ingestor.Read([&](const FleetState& s) {
    std::vector<Point> out;
    for (auto it = s.minutes.lower_bound(FirstMinute(minutes, now_ns)); it != s.minutes.end(); ++it) {
      const FleetState::Minute& m = *it->second;
      out.push_back({it->first, m.reports, m.agents.size(), m.busy_seconds, m.tls_seconds, m.bucket_seconds});
    }
    return out;
  });
  nlohmann::json out = {{"minutes", minutes}, {"now", now_ns / 1'000'000'000}, {"points", nlohmann::json::array()}};
  for (const Point& p : points) {
    nlohmann::json buckets = nlohmann::json::object();
    for (int b = v1::BUCKET_CIPHER; b <= v1::BUCKET_OTHER; ++b)
      buckets[std::string(BucketName(static_cast<v1::Bucket>(b)))] = p.buckets[b];
    out["points"].push_back({{"minute", p.minute * 60},
                             {"reports", p.reports},
                             {"agents", p.agents},
                             {"busy_cpu_seconds", p.busy},
                             {"tls_cpu_seconds", p.tls},
                             {"tls_share", p.busy > 0 ? p.tls / p.busy : 0.0},
                             {"bucket_cpu_seconds", std::move(buckets)}});
  }
  return out;
}

namespace {

struct AgentRow {
  std::string key, hostname;
  int64_t last_seen_ns;
  uint64_t reports;
  size_t instances, series, services;
  bool skew_known;
  int64_t skew_ns;
};

// The `limit` most recently seen agents (a partial sort of pointers, then
// only those copied), and how many there are.
std::pair<std::vector<AgentRow>, size_t> RecentAgents(const FleetState& s, size_t limit) {
  std::vector<const std::pair<const std::string, Shared<FleetState::Agent>>*> all;
  all.reserve(s.agents.size());
  for (const auto& entry : s.agents) all.push_back(&entry);
  const size_t n = std::min(limit, all.size());
  std::partial_sort(all.begin(), all.begin() + n, all.end(), [](const auto* a, const auto* b) {
    if (a->second->last_seen_ns != b->second->last_seen_ns) return a->second->last_seen_ns > b->second->last_seen_ns;
    return a->first < b->first;
  });
  std::vector<AgentRow> rows;
  rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& [key, shared] = *all[i];
    const FleetState::Agent& agent = *shared;
    rows.push_back({key, agent.hostname, agent.last_seen_ns, agent.reports, agent.instances.size(), agent.series.size(),
                    agent.services.size(), agent.skew_known, agent.skew_ns});
  }
  return {std::move(rows), all.size()};
}

}  // namespace

nlohmann::json AgentsJson(const Ingestor& ingestor, size_t limit, int64_t now_ns) {
  const auto [rows, total] = ingestor.Read([&](const FleetState& s) { return RecentAgents(s, limit); });
  nlohmann::json out = {{"now", now_ns / 1'000'000'000},
                        {"total", total},
                        {"truncated", rows.size() < total},
                        {"agents", nlohmann::json::array()}};
  for (const AgentRow& r : rows) {
    // MakeAgentKey: identity, then NUL and the hostname for a relay's host.
    const size_t nul = r.key.find('\0');
    out["agents"].push_back({{"identity", r.key.substr(0, nul)},
                             {"relay_host", nul == std::string::npos ? "" : r.key.substr(nul + 1)},
                             {"hostname", r.hostname},
                             {"last_seen", static_cast<double>(r.last_seen_ns) / 1e9},
                             {"age_seconds", static_cast<double>(now_ns - r.last_seen_ns) / 1e9},
                             {"reports", r.reports},
                             {"instances", r.instances},
                             {"series", r.series},
                             {"services", r.services},
                             {"clock_skew_seconds", r.skew_known ? nlohmann::json(static_cast<double>(r.skew_ns) / 1e9)
                                                                 : nlohmann::json(nullptr)}});
  }
  return out;
}

}  // namespace tlsprof::collector
