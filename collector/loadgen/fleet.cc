#include "collector/loadgen/fleet.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace tlsprof::loadgen {
namespace {

using v1::Bucket;
using v1::Phase;

// What a TLS library's rows can be: (bucket, algorithm, phase) with the base
// weight of its share of TLS CPU on a typical HTTPS server (bulk AES-GCM
// records first, then handshake signatures and key exchange). The algorithm
// names are the agent's canonical ones (docs/report-schema.md).
struct Combo {
  Bucket bucket;
  const char* algorithm;
  Phase phase;
  double weight;
};

constexpr Combo kCombos[] = {
    {v1::BUCKET_CIPHER, "AES-GCM", v1::PHASE_RECORD, 40},
    {v1::BUCKET_CIPHER, "AES-GCM", v1::PHASE_HANDSHAKE, 1.5},
    {v1::BUCKET_CIPHER, "AES-GCM", v1::PHASE_OTHER, 0.5},
    {v1::BUCKET_CIPHER, "ChaCha20-Poly1305", v1::PHASE_RECORD, 8},
    {v1::BUCKET_CIPHER, "ChaCha20-Poly1305", v1::PHASE_HANDSHAKE, 0.3},
    {v1::BUCKET_CIPHER, "ChaCha20-Poly1305", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_CIPHER, "AES-CBC", v1::PHASE_RECORD, 3},
    {v1::BUCKET_CIPHER, "AES-CBC", v1::PHASE_HANDSHAKE, 0.2},
    {v1::BUCKET_CIPHER, "AES-CBC", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_CIPHER, "AES-CTR", v1::PHASE_RECORD, 1},
    {v1::BUCKET_CIPHER, "AES-CTR", v1::PHASE_OTHER, 0.3},
    {v1::BUCKET_CIPHER, "unknown", v1::PHASE_RECORD, 2},
    {v1::BUCKET_CIPHER, "unknown", v1::PHASE_HANDSHAKE, 0.3},
    {v1::BUCKET_CIPHER, "unknown", v1::PHASE_OTHER, 0.3},
    {v1::BUCKET_SIGNATURE, "RSA", v1::PHASE_HANDSHAKE, 12},
    {v1::BUCKET_SIGNATURE, "RSA", v1::PHASE_OTHER, 0.5},
    {v1::BUCKET_SIGNATURE, "ECDSA-P256", v1::PHASE_HANDSHAKE, 6},
    {v1::BUCKET_SIGNATURE, "ECDSA-P256", v1::PHASE_OTHER, 0.3},
    {v1::BUCKET_SIGNATURE, "ECDSA-P384", v1::PHASE_HANDSHAKE, 1.5},
    {v1::BUCKET_SIGNATURE, "ECDSA-P384", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_SIGNATURE, "Ed25519", v1::PHASE_HANDSHAKE, 0.5},
    {v1::BUCKET_SIGNATURE, "Ed25519", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_SIGNATURE, "unknown", v1::PHASE_HANDSHAKE, 0.5},
    {v1::BUCKET_SIGNATURE, "unknown", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_KEY_EXCHANGE, "X25519", v1::PHASE_HANDSHAKE, 7},
    {v1::BUCKET_KEY_EXCHANGE, "X25519", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_KEY_EXCHANGE, "ECDHE-P256", v1::PHASE_HANDSHAKE, 4},
    {v1::BUCKET_KEY_EXCHANGE, "ECDHE-P256", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_KEY_EXCHANGE, "ECDHE-P384", v1::PHASE_HANDSHAKE, 1},
    {v1::BUCKET_KEY_EXCHANGE, "ECDHE-P384", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_KEY_EXCHANGE, "ML-KEM", v1::PHASE_HANDSHAKE, 0.8},
    {v1::BUCKET_KEY_EXCHANGE, "ML-KEM", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_KEY_EXCHANGE, "RSA", v1::PHASE_HANDSHAKE, 0.5},
    {v1::BUCKET_KEY_EXCHANGE, "unknown", v1::PHASE_HANDSHAKE, 0.4},
    {v1::BUCKET_KEY_EXCHANGE, "unknown", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_HASH, "SHA-256", v1::PHASE_HANDSHAKE, 3},
    {v1::BUCKET_HASH, "SHA-256", v1::PHASE_RECORD, 1.5},
    {v1::BUCKET_HASH, "SHA-256", v1::PHASE_OTHER, 0.5},
    {v1::BUCKET_HASH, "SHA-512", v1::PHASE_HANDSHAKE, 1},
    {v1::BUCKET_HASH, "SHA-512", v1::PHASE_RECORD, 0.3},
    {v1::BUCKET_HASH, "SHA-512", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_HASH, "SHA-1", v1::PHASE_HANDSHAKE, 0.4},
    {v1::BUCKET_HASH, "SHA-1", v1::PHASE_RECORD, 1},
    {v1::BUCKET_HASH, "SHA-1", v1::PHASE_OTHER, 0.2},
    {v1::BUCKET_HASH, "MD5", v1::PHASE_HANDSHAKE, 0.1},
    {v1::BUCKET_HASH, "MD5", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_HASH, "unknown", v1::PHASE_HANDSHAKE, 0.3},
    {v1::BUCKET_HASH, "unknown", v1::PHASE_RECORD, 0.3},
    {v1::BUCKET_HASH, "unknown", v1::PHASE_OTHER, 0.1},
    {v1::BUCKET_OTHER, "unknown", v1::PHASE_HANDSHAKE, 4},
    {v1::BUCKET_OTHER, "unknown", v1::PHASE_RECORD, 6},
    {v1::BUCKET_OTHER, "unknown", v1::PHASE_OTHER, 2},
    {v1::BUCKET_OTHER, "P-256 (ECDSA or ECDHE)", v1::PHASE_HANDSHAKE, 1},
    {v1::BUCKET_OTHER, "P-256 (ECDSA or ECDHE)", v1::PHASE_OTHER, 0.1},
};
constexpr uint32_t kCombosPerLibrary = std::size(kCombos);

// TLS library kinds as the agent names them (agent/classify LibraryKindName).
constexpr const char* kLibraries[] = {"openssl-3", "openssl-1.1", "boringssl", "go"};

// The first entries of the service pool: names a fleet would have, each with
// the library it links. Pools larger than this continue as svc-<k>.
struct NamedService {
  const char* name;
  uint32_t library;
};
constexpr NamedService kNamedServices[] = {
    {"nginx", 0},    {"haproxy", 0},     {"envoy", 2},    {"caddy", 3},     {"api-gateway", 3},
    {"payments", 0}, {"auth", 3},        {"billing", 1},  {"grpc-edge", 2}, {"postgres", 0},
    {"redis", 0},    {"search", 3},      {"node-web", 0}, {"mail", 1},      {"ldap", 0},
    {"vault", 3},    {"kafka-proxy", 2}, {"cdn-edge", 2}, {"sftp", 0},      {"metrics-push", 3},
};

// SplitMix64: a fixed, portable generator, so that a seed means the same
// reports on every build (std:: distributions are implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Next() % n); }

 private:
  uint64_t state_;
};

// One independent stream per (seed, agent, sequence, purpose).
uint64_t StreamSeed(uint64_t seed, uint64_t agent, uint64_t sequence, uint64_t purpose) {
  Rng r(seed);
  uint64_t h = r.Next() ^ (agent * 0xd1b54a32d192ed03ull);
  h = Rng(h).Next() ^ (sequence * 0xaef17502108ef2d9ull);
  h = Rng(h).Next() ^ (purpose * 0x9e3779b97f4a7c15ull);
  return Rng(h).Next();
}

enum Purpose : uint64_t { kShape = 1, kIdentity = 2, kWindow = 3 };

constexpr uint32_t kCpuChoices[] = {2, 4, 8, 16, 32, 64};
constexpr uint32_t kCpuWeights[] = {1, 3, 4, 3, 2, 1};

uint32_t PickCpus(Rng& rng) {
  uint32_t total = std::accumulate(std::begin(kCpuWeights), std::end(kCpuWeights), 0u);
  uint32_t x = rng.Below(total);
  for (size_t i = 0; i < std::size(kCpuChoices); ++i) {
    if (x < kCpuWeights[i]) return kCpuChoices[i];
    x -= kCpuWeights[i];
  }
  return kCpuChoices[0];
}

std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string RandomBytes(Rng& rng, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(rng.Next() & 0xff);
  return out;
}

// Splits `total` into parts proportional to `weights` with every part ≥ `min`
// (total ≥ min × parts); the parts add up to `total` exactly.
std::vector<uint64_t> Split(uint64_t total, const std::vector<double>& weights, uint64_t min) {
  std::vector<uint64_t> parts(weights.size(), min);
  uint64_t rest = total - min * weights.size();
  double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  uint64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    uint64_t share = static_cast<uint64_t>(std::floor(static_cast<double>(rest) * weights[i] / sum));
    parts[i] += share;
    given += share;
  }
  // Rounding leaves fewer than parts.size() samples: one each, from the
  // largest weight on, deterministically.
  size_t first = static_cast<size_t>(std::max_element(weights.begin(), weights.end()) - weights.begin());
  for (size_t k = 0; given < rest; ++k, ++given) parts[(first + k) % parts.size()] += 1;
  return parts;
}

}  // namespace

Result<Fleet> Fleet::Make(const FleetOptions& options) {
  if (options.agents == 0) return MakeError("--agents must be at least 1");
  if (options.services == 0) return MakeError("--services must be at least 1");
  if (options.frequency_hz == 0) return MakeError("--frequency must be at least 1");
  if (!(options.interval_seconds >= 0.1 && options.interval_seconds <= 3600)) {
    return MakeError("--interval {} is out of range: 0.1 to 3600 seconds (the collector rejects windows over 1 h)",
                     options.interval_seconds);
  }
  if (options.series == 0) return MakeError("--series must be at least 1");
  if (options.series > static_cast<uint64_t>(options.services) * kCombosPerLibrary) {
    return MakeError("--series {} is more than {} services can report ({} rows each): raise --services", options.series,
                     options.services, kCombosPerLibrary);
  }
  // Every row carries at least one sample, and a host's busy samples stay
  // under its capacity: the smallest host (2 CPUs) must have room for them.
  double min_capacity = 2.0 * options.interval_seconds * options.frequency_hz;
  if (options.series > min_capacity * 0.5) {
    return MakeError(
        "--series {} needs more samples than a 2-CPU host has in {} s at {} Hz: lengthen --interval or "
        "raise --frequency",
        options.series, options.interval_seconds, options.frequency_hz);
  }

  Fleet fleet;
  fleet.options_ = options;
  fleet.interval_ns_ = std::llround(options.interval_seconds * 1e9);
  fleet.period_ns_ = static_cast<uint64_t>(std::llround(1e9 / options.frequency_hz));
  for (uint32_t k = 0; k < options.services; ++k) {
    fleet.service_names_.push_back(k < std::size(kNamedServices) ? std::string(kNamedServices[k].name)
                                                                 : fmt::format("svc-{}", k));
  }
  auto library_of = [](uint32_t k) {
    return k < std::size(kNamedServices) ? kNamedServices[k].library : k % std::size(kLibraries);
  };

  const uint32_t min_services = (options.series + kCombosPerLibrary - 1) / kCombosPerLibrary;
  fleet.agents_.reserve(options.agents);
  for (uint32_t i = 0; i < options.agents; ++i) {
    Rng rng(StreamSeed(options.seed, i, 0, kShape));
    Rng id(StreamSeed(options.seed, i, 0, kIdentity));
    AgentShape a;
    a.hostname = fmt::format("{}{}", options.hostname_prefix, i);
    a.instance = RandomBytes(id, 16);
    a.machine_id = Hex(RandomBytes(id, 16));
    a.cpus = PickCpus(rng);
    a.busy_fraction = rng.Uniform(0.15, 0.75);
    a.non_tls_weight = rng.Uniform(0.5, 3.0);

    // A few services per host, at least as many as the rows need.
    uint32_t n = std::min(options.services, std::max(min_services, 1 + rng.Below(3)));
    std::vector<uint32_t> pool(options.services);
    std::iota(pool.begin(), pool.end(), 0u);
    for (uint32_t s = 0; s < n; ++s) std::swap(pool[s], pool[s + rng.Below(options.services - s)]);
    // Rows per service: `series` split as evenly as the table allows.
    std::vector<uint32_t> rows(n, options.series / n);
    for (uint32_t s = 0; s < options.series % n; ++s) rows[s] += 1;
    for (uint32_t s = 0; s < n; ++s) {
      ServiceShape svc;
      svc.name = pool[s];
      svc.library = library_of(pool[s]);
      svc.processes = 1 + rng.Below(16);
      svc.busy_weight = rng.Uniform(0.5, 2.0);
      svc.tls_fraction = rng.Uniform(0.05, 0.45);
      std::array<uint16_t, kCombosPerLibrary> combos;
      std::iota(combos.begin(), combos.end(), uint16_t{0});
      for (uint32_t r = 0; r < rows[s]; ++r) {
        std::swap(combos[r], combos[r + rng.Below(kCombosPerLibrary - r)]);
        // The base weight, times a host-specific factor between 1/e and e.
        svc.rows.push_back({combos[r], kCombos[combos[r]].weight * std::exp(rng.Uniform(-1.0, 1.0))});
      }
      a.services.push_back(std::move(svc));
    }
    fleet.agents_.push_back(std::move(a));
  }
  return fleet;
}

void Fleet::BuildReport(uint32_t agent, uint64_t sequence, int64_t start_unix_ns, v1::AgentReport* report) const {
  const AgentShape& a = agents_[agent];
  Rng rng(StreamSeed(options_.seed, agent, sequence, kWindow));
  report->Clear();
  report->set_agent_instance(a.instance);
  report->set_sequence(sequence);
  auto* host = report->mutable_host();
  host->set_hostname(a.hostname);
  host->set_machine_id(a.machine_id);
  host->set_agent_version("tlsprof-loadgen");
  host->set_cpus(a.cpus);
  auto* window = report->mutable_window();
  window->set_start_unix_ns(start_unix_ns);
  window->set_end_unix_ns(start_unix_ns + interval_ns_);
  window->set_frequency_hz(options_.frequency_hz);
  window->set_period_ns(period_ns_);

  const double capacity = static_cast<double>(a.cpus) * options_.interval_seconds * options_.frequency_hz;
  const uint64_t busy = static_cast<uint64_t>(capacity * a.busy_fraction * rng.Uniform(0.85, 1.15));

  // Busy samples per service, "(non-tls)" last, each ≥ 1.
  std::vector<double> weights;
  for (const ServiceShape& s : a.services) weights.push_back(s.busy_weight * rng.Uniform(0.8, 1.2));
  weights.push_back(a.non_tls_weight * rng.Uniform(0.8, 1.2));
  std::vector<uint64_t> service_busy = Split(std::max<uint64_t>(busy, weights.size()), weights, 1);

  uint64_t busy_total = 0;
  std::vector<double> row_weights;
  for (size_t s = 0; s < a.services.size(); ++s) {
    const ServiceShape& shape = a.services[s];
    auto* svc = report->add_services();
    svc->set_name(service_names_[shape.name]);
    svc->set_processes(shape.processes);
    uint64_t rows = shape.rows.size();
    uint64_t tls_target =
        static_cast<uint64_t>(static_cast<double>(service_busy[s]) * shape.tls_fraction * rng.Uniform(0.8, 1.2));
    row_weights.clear();
    for (const RowShape& r : shape.rows) row_weights.push_back(r.weight * rng.Uniform(0.7, 1.3));
    std::vector<uint64_t> samples = Split(std::max(tls_target, rows), row_weights, 1);
    uint64_t tls = 0;
    for (size_t r = 0; r < rows; ++r) {
      const Combo& c = kCombos[shape.rows[r].combo];
      auto* row = svc->add_tls();
      row->set_bucket(c.bucket);
      row->set_algorithm(c.algorithm);
      row->set_phase(c.phase);
      row->set_library(kLibraries[shape.library]);
      row->set_samples(samples[r]);
      tls += samples[r];
    }
    svc->set_tls_samples(tls);
    svc->set_busy_samples(std::max(service_busy[s], tls));
    busy_total += svc->busy_samples();
  }
  auto* other = report->add_services();
  other->set_name("(non-tls)");
  other->set_busy_samples(service_busy.back());
  other->set_processes(20 + rng.Below(200));
  busy_total += service_busy.back();
  report->set_busy_samples(busy_total);

  auto* stats = report->mutable_agent();
  stats->set_cpu_seconds(options_.interval_seconds * rng.Uniform(0.002, 0.01));
  stats->set_max_rss_bytes((40ull << 20) + rng.Below(40u << 20));
}

ReportTotals Totals(const v1::AgentReport& report) {
  ReportTotals t;
  for (const auto& s : report.services()) {
    t.busy_samples += s.busy_samples();
    t.tls_samples += s.tls_samples();
    t.rows += s.tls_size();
  }
  return t;
}

}  // namespace tlsprof::loadgen
