// No privileges: services, the report encoding and the agent's metrics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "agent/expose/metrics.h"
#include "agent/wire/encode.h"
#include "agent/wire/services.h"
#include "collector/ingest/validate.h"

namespace tlsprof::wire {
namespace {

using expose::AgentMetrics;
using expose::CheckListenAddress;

using classify::Bucket;
using classify::LibraryKind;
using classify::Phase;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(Services, UnitFromCgroup) {
  EXPECT_EQ(UnitFromCgroup("/system.slice/nginx.service"), "nginx");
  EXPECT_EQ(UnitFromCgroup("/system.slice/system-getty.slice/getty@tty1.service"), "getty@tty1");
  EXPECT_EQ(UnitFromCgroup("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service"), "foo");
  EXPECT_EQ(UnitFromCgroup("/system.slice/haproxy.service/worker"), "haproxy");
  EXPECT_EQ(UnitFromCgroup("/user.slice/user-1000.slice/user@1000.service/init.scope"), "");
  EXPECT_EQ(UnitFromCgroup("/user.slice/user-0.slice/session-3.scope"), "");
  EXPECT_EQ(UnitFromCgroup("/"), "");
  EXPECT_EQ(UnitFromCgroup(""), "");
}

TEST(Services, NameFallsBackToCommAndIsSanitized) {
  EXPECT_EQ(ServiceName("/system.slice/nginx.service", "nginx: worker"), "nginx");
  EXPECT_EQ(ServiceName("/user.slice/user-0.slice/session-3.scope", "tlsprof-demo"), "tlsprof-demo");
  EXPECT_EQ(ServiceName("", "a\"b{c}=d\n"), "a_b_c__d_");
  EXPECT_EQ(SanitizeLabel(""), "unknown");
  EXPECT_EQ(SanitizeLabel(std::string(100, 'x')).size(), 64u);
  for (std::string_view v : {"nginx", "(non-tls)", "openssl-3", "AES-128-GCM", "a b:c/d.e+f"}) {
    EXPECT_TRUE(IsValidLabel(v)) << v;
    EXPECT_EQ(SanitizeLabel(v), v);
  }
  EXPECT_FALSE(IsValidLabel(""));
  EXPECT_FALSE(IsValidLabel("a\"b"));
  EXPECT_FALSE(IsValidLabel(std::string(65, 'x')));
}

aggregate::ProcessAttribution Process(pid_t pid, std::string comm, uint64_t busy) {
  aggregate::ProcessAttribution p;
  p.pid = pid;
  p.comm = std::move(comm);
  p.samples = busy;
  return p;
}

void AddTls(aggregate::ProcessAttribution& p, Bucket b, std::string_view alg, Phase ph, LibraryKind lib, uint64_t n) {
  p.crypto.Add({b, alg}, ph, lib, n);
}

// Two TLS processes of one unit, one Go process named by its comm, a process
// mapping a TLS library without TLS samples, two plain processes, and busy
// samples no process entry holds (the pid map was full).
aggregate::Attribution SampleProfile() {
  aggregate::Attribution profile;
  auto w1 = Process(101, "nginx", 500);
  AddTls(w1, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kOpenSSL3, 200);
  AddTls(w1, Bucket::kSignature, "ECDSA-P256", Phase::kHandshake, LibraryKind::kOpenSSL3, 50);
  auto w2 = Process(102, "nginx", 300);
  AddTls(w2, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kOpenSSL3, 100);
  auto go = Process(200, "gosrv", 400);
  AddTls(go, Bucket::kCipher, "ChaCha20-Poly1305", Phase::kRecord, LibraryKind::kGo, 120);
  auto idle_tls = Process(300, "curl", 10);
  idle_tls.libraries.push_back({});  // maps a TLS library, no TLS sample in the window
  profile.processes[101] = w1;
  profile.processes[102] = w2;
  profile.processes[200] = go;
  profile.processes[300] = idle_tls;
  profile.processes[400] = Process(400, "bash", 70);
  profile.processes[401] = Process(401, "kworker/0:1", 30);
  profile.scope_samples = 500 + 300 + 400 + 10 + 70 + 30 + 25;
  return profile;
}

ServiceKey ServiceOf(const aggregate::ProcessAttribution& p) {
  return {ServiceName(p.comm == "nginx" ? "/system.slice/nginx.service" : "", p.comm), "", ""};
}

ServiceKey CommOf(const aggregate::ProcessAttribution& p) { return {p.comm, "", ""}; }

TEST(Encode, GroupsProcessesIntoServices) {
  const auto services = GroupServices(SampleProfile(), SampleProfile().scope_samples, ServiceOf);
  ASSERT_EQ(services.size(), 4u);
  const ServiceTotals& nginx = services.at({"nginx"});
  EXPECT_EQ(nginx.busy_samples, 800u);
  EXPECT_EQ(nginx.tls_samples, 350u);
  EXPECT_EQ(nginx.processes, 2u);
  EXPECT_EQ(nginx.tls.at({{Bucket::kCipher, "AES-128-GCM", Phase::kRecord}, LibraryKind::kOpenSSL3}), 300u);
  EXPECT_EQ(services.at({"gosrv"}).tls_samples, 120u);
  EXPECT_EQ(services.at({"curl"}).busy_samples, 10u);
  EXPECT_EQ(services.at({"curl"}).tls_samples, 0u);
  // bash + kworker + the 25 samples without a process entry.
  EXPECT_EQ(services.at({"(non-tls)"}).busy_samples, 125u);
  EXPECT_EQ(services.at({"(non-tls)"}).processes, 2u);
}

TEST(Encode, ReportAddsUpAndUsesTheWireEnums) {
  const aggregate::Attribution profile = SampleProfile();
  const auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  v1::Host host;
  host.set_hostname("h1");
  host.set_cpus(2);
  v1::AgentStats agent;
  agent.set_cpu_seconds(0.25);
  const WindowInfo window{.start_unix_ns = 1'000'000'000,
                          .end_unix_ns = 11'000'000'000,
                          .frequency_hz = 49,
                          .period_ns = 1'000'000'000 / 49};
  const v1::AgentReport r = EncodeReport(services, profile.scope_samples, window, host, agent);
  EXPECT_EQ(r.window().start_unix_ns(), 1'000'000'000);
  EXPECT_EQ(r.window().end_unix_ns(), 11'000'000'000);
  EXPECT_EQ(r.window().period_ns(), 1'000'000'000u / 49);
  EXPECT_EQ(r.host().hostname(), "h1");
  EXPECT_DOUBLE_EQ(r.agent().cpu_seconds(), 0.25);
  EXPECT_EQ(r.busy_samples(), profile.scope_samples);
  uint64_t busy = 0;
  for (const v1::Service& s : r.services()) {
    busy += s.busy_samples();
    uint64_t rows = 0;
    EXPECT_TRUE(IsValidLabel(s.name())) << s.name();
    for (const v1::TlsCpu& row : s.tls()) {
      rows += row.samples();
      EXPECT_NE(row.bucket(), v1::BUCKET_UNSPECIFIED);
      EXPECT_NE(row.phase(), v1::PHASE_UNSPECIFIED);
      EXPECT_TRUE(IsValidLabel(row.algorithm()) && IsValidLabel(row.library()));
    }
    EXPECT_EQ(rows, s.tls_samples()) << s.name();
    EXPECT_LE(s.tls_samples(), s.busy_samples()) << s.name();
    if (s.name() == "gosrv") {
      ASSERT_EQ(s.tls_size(), 1);
      EXPECT_EQ(s.tls(0).bucket(), v1::BUCKET_CIPHER);
      EXPECT_EQ(s.tls(0).phase(), v1::PHASE_RECORD);
      EXPECT_EQ(s.tls(0).library(), "go");
      EXPECT_EQ(s.tls(0).algorithm(), "ChaCha20-Poly1305");
    }
  }
  EXPECT_EQ(busy, r.busy_samples()) << "services must add up to the host";
  // Round trip through the wire format.
  v1::AgentReport back;
  ASSERT_TRUE(back.ParseFromString(r.SerializeAsString()));
  EXPECT_EQ(back.services_size(), r.services_size());
}

TEST(Encode, TlsAheadOfBusyAtAWindowEdgeStaysValid) {
  ServiceMap services;
  ServiceTotals& s = services[{"svc"}];
  s.busy_samples = 10;
  s.tls_samples = 12;
  s.tls[{{Bucket::kHash, "SHA-256", Phase::kOther}, LibraryKind::kOpenSSL3}] = 12;
  const auto r = EncodeReport(services, 10, {0, 1, 99, 1'000'000'000 / 99}, {}, {});
  ASSERT_EQ(r.services_size(), 1);
  EXPECT_EQ(r.services(0).busy_samples(), 12u);
  EXPECT_EQ(r.busy_samples(), 12u);
}

TEST(Encode, TooManyServicesOverflow) {
  aggregate::Attribution profile;
  for (pid_t pid = 1; pid <= 100; ++pid) {
    auto p = Process(pid, "svc" + std::to_string(pid), static_cast<uint64_t>(pid));
    AddTls(p, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kOpenSSL3, 1);
    profile.processes[pid] = p;
    profile.scope_samples += static_cast<uint64_t>(pid);
  }
  const auto services = GroupServices(profile, profile.scope_samples, CommOf);
  EXPECT_LE(services.size(), kMaxServices);
  ASSERT_TRUE(services.contains({"(overflow)"}));
  EXPECT_TRUE(services.contains({"svc100"}));  // the busiest stay
  EXPECT_FALSE(services.contains({"svc1"}));
  uint64_t busy = 0, tls = 0;
  for (const auto& [name, s] : services) busy += s.busy_samples, tls += s.tls_samples;
  EXPECT_EQ(busy, profile.scope_samples);
  EXPECT_EQ(tls, 100u);
}

TEST(Metrics, CountsReportsInSeconds) {
  AgentMetrics metrics;
  const aggregate::Attribution profile = SampleProfile();
  const auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  const WindowInfo window{0, 10'000'000'000, 100, 10'000'000};  // 10 ms per sample
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}));
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}));
  metrics.AddWindow({.duration_seconds = 10, .agent_cpu_seconds = 0.5, .resident_bytes = 1 << 20});
  metrics.SetShip({.sealed = 3, .accepted = 2, .send_errors = 1, .spooled_batches = 1, .spooled_bytes = 100});
  metrics.SetShip({.sealed = 4, .accepted = 4, .send_errors = 1});
  const std::string text = metrics.Text();
  // 2 windows x 300 samples x 10 ms.
  EXPECT_THAT(text,
              HasSubstr("tlsprof_cpu_seconds_total{algorithm=\"AES-128-GCM\",bucket=\"cipher\",library=\"openssl-3\","
                        "phase=\"record\",service=\"nginx\"} 6"));
  EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"(non-tls)\"} 2.5"));
  EXPECT_THAT(text, HasSubstr("tlsprof_reports_total 2"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_windows_total 1"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_batches_total{result=\"accepted\"} 4"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_batches_total{result=\"sealed\"} 4"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_send_errors_total 1"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_spool_batches 0"));
}

TEST(Metrics, SeriesAreCapped) {
  AgentMetrics metrics;
  v1::AgentReport report;
  report.mutable_window()->set_period_ns(1'000'000'000);
  const size_t services = AgentMetrics::kMaxSeries + 100;
  for (size_t i = 0; i < services; ++i) {
    v1::Service* s = report.add_services();
    s->set_name("svc" + std::to_string(i));
    s->set_busy_samples(1);
  }
  metrics.AddReport(report);
  metrics.AddReport(report);
  const std::string text = metrics.Text();
  size_t series = 0;
  for (size_t pos = 0; (pos = text.find("\ntlsprof_busy_cpu_seconds_total{", pos)) != std::string::npos; ++pos)
    ++series;
  EXPECT_EQ(series, AgentMetrics::kMaxSeries + 1);
  // Both reports' 100 services beyond the cap, one second each.
  EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"(overflow)\"} 200"));
  EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"svc0\"} 2"));
}

// Two replicas of one image (same comm, same cgroup layout), a process on the
// host with the same comm, and a plain process in a container.
TEST(Containers, ReplicasAreSeparateServices) {
  const std::string pod = "8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2e";
  const std::string a(64, 'a'), b(64, 'b');
  std::map<pid_t, discovery::ContainerIdentity> identity;
  identity[1] = discovery::IdentityFromCgroupPath("/kubepods/besteffort/pod" + pod + "/" + a);
  identity[2] = discovery::IdentityFromCgroupPath("/kubepods/besteffort/pod" + pod + "/" + b);
  identity[4] = discovery::IdentityFromCgroupPath("/docker/" + a);
  aggregate::Attribution profile;
  for (pid_t pid : {1, 2, 3}) {
    auto p = Process(pid, "envoy", 100);
    AddTls(p, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kBoringSSL, 10 * pid);
    profile.processes[pid] = p;
  }
  profile.processes[4] = Process(4, "sleep", 50);  // no TLS: (non-tls), whatever its container
  profile.scope_samples = 350;
  for (bool labels : {true, false}) {
    const auto services = GroupServices(profile, profile.scope_samples, [&](const aggregate::ProcessAttribution& p) {
      return ServiceKeyOf("", p.comm, identity[p.pid], labels);
    });
    if (!labels) {
      ASSERT_EQ(services.size(), 2u);
      EXPECT_EQ(services.at({"envoy"}).tls_samples, 60u);
      EXPECT_EQ(services.at({"envoy"}).processes, 3u);
      continue;
    }
    ASSERT_EQ(services.size(), 4u);
    EXPECT_EQ(services.at({"envoy", "aaaaaaaaaaaa", pod}).tls_samples, 10u);
    EXPECT_EQ(services.at({"envoy", "bbbbbbbbbbbb", pod}).tls_samples, 20u);
    EXPECT_EQ(services.at({"envoy"}).tls_samples, 30u);
    EXPECT_EQ(services.at({"(non-tls)"}).busy_samples, 50u);

    const auto r = EncodeReport(services, profile.scope_samples, {0, 10'000'000'000, 100, 10'000'000}, {}, {});
    std::set<std::tuple<std::string, std::string, uint64_t>> rows;
    for (const v1::Service& s : r.services()) rows.insert({s.container_id(), s.pod_uid(), s.tls_samples()});
    EXPECT_EQ(rows, (std::set<std::tuple<std::string, std::string, uint64_t>>{
                        {"", "", 0}, {"", "", 30}, {"aaaaaaaaaaaa", pod, 10}, {"bbbbbbbbbbbb", pod, 20}}));

    AgentMetrics metrics;
    metrics.AddReport(r);
    const std::string text = metrics.Text();
    EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{container_id=\"aaaaaaaaaaaa\",pod_uid=\"" + pod +
                                "\",service=\"envoy\"} 1"));
    EXPECT_THAT(text, HasSubstr("tlsprof_cpu_seconds_total{algorithm=\"AES-128-GCM\",bucket=\"cipher\","
                                "container_id=\"bbbbbbbbbbbb\",library=\"boringssl\",phase=\"record\",pod_uid=\"" +
                                pod + "\",service=\"envoy\"} 0.2"));
    // The host's envoy and (non-tls): no container labels at all, not empty ones.
    EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"envoy\"} 1"));
    EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"(non-tls)\"} 0.5"));
    EXPECT_THAT(text, Not(HasSubstr("=\"\"")));
  }
}

TEST(Containers, OverflowHasNoContainer) {
  aggregate::Attribution profile;
  for (pid_t pid = 1; pid <= 100; ++pid) {
    auto p = Process(pid, "worker", static_cast<uint64_t>(pid));
    AddTls(p, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kOpenSSL3, 1);
    profile.processes[pid] = p;
    profile.scope_samples += static_cast<uint64_t>(pid);
  }
  // One image, 100 containers: one service name, 100 keys.
  const auto services = GroupServices(profile, profile.scope_samples, [](const aggregate::ProcessAttribution& p) {
    char id[13];
    std::snprintf(id, sizeof id, "%012x", static_cast<unsigned>(p.pid));
    return ServiceKey{"worker", id, ""};
  });
  // The busiest containers, each its own key, and (overflow) (no (non-tls) here).
  EXPECT_EQ(services.size(), kMaxServices - 1);
  ASSERT_TRUE(services.contains({"(overflow)"}));
  EXPECT_EQ(services.at({"(overflow)"}).processes, 100 - (kMaxServices - 2));
  EXPECT_TRUE(services.contains({"worker", "000000000064", ""}));  // pid 100, the busiest
  EXPECT_FALSE(services.contains({"worker", "000000000001", ""}));
  uint64_t busy = 0;
  for (const auto& [key, s] : services) busy += s.busy_samples;
  EXPECT_EQ(busy, profile.scope_samples);
}

TEST(Metrics, SeriesCapOverflowDropsTheContainer) {
  AgentMetrics metrics;
  v1::AgentReport report;
  report.mutable_window()->set_period_ns(1'000'000'000);
  for (size_t i = 0; i < AgentMetrics::kMaxSeries + 10; ++i) {
    v1::Service* s = report.add_services();
    s->set_name("svc");
    char id[13];
    std::snprintf(id, sizeof id, "%012zx", i);
    s->set_container_id(id);
    s->set_busy_samples(1);
  }
  metrics.AddReport(report);
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{service=\"(overflow)\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("tlsprof_busy_cpu_seconds_total{container_id=\"000000000000\",service=\"svc\"} 1\n"));
}

// --- Usage telemetry (run --usage): the window's probe counts per service.

constexpr uint32_t kEvpRsa = 6, kEvpEc = 408, kEvpX25519 = 1034;

usage::HandshakeCount Handshake(uint32_t tgid, uint8_t resumed, uint16_t cipher, uint32_t cert, uint64_t n) {
  usage::HandshakeCount h;
  h.key.tgid = tgid;
  h.key.lib = 1;
  h.key.version = 0x0304;
  h.key.cipher = cipher;
  h.key.is_server = 1;
  h.key.resumed = resumed;
  h.key.kx_type = kEvpX25519;
  h.key.kx_len = 32;
  h.key.cert_type = cert;
  h.count = n;
  h.estimated = static_cast<double>(n);
  return h;
}

// `n` operations of `ns` on-CPU nanoseconds each, in the slot that holds `ns`.
usage::OperationStats Operation(uint32_t tgid, uint8_t op, uint32_t key_type, uint32_t len, uint64_t n, uint64_t ns) {
  usage::OperationStats o;
  o.key.tgid = tgid;
  o.key.lib = 1;
  o.key.op = op;
  o.key.in_handshake = 1;
  o.key.key_type = key_type;
  o.key.len = len;
  o.count = n;
  o.cpu_ns = n * ns;
  o.wall_ns = n * ns;
  o.slots.assign(USAGE_HIST_SLOTS, 0);
  for (uint32_t i = 0; i < USAGE_HIST_SLOTS; ++i) {
    auto [lo, hi] = usage::SlotBounds(i);
    if (ns >= lo && ns < hi) o.slots[i] = n;
  }
  o.estimated = static_cast<double>(n);
  return o;
}

// nginx (two workers, 101 and 102), a process the samples did not see (900),
// and the agent itself (pid 7, left out), with the calibration row.
usage::UsageSnapshot SampleUsage() {
  usage::UsageSnapshot u;
  u.handshakes = {Handshake(101, 0, 0x1301, kEvpEc, 6), Handshake(102, 0, 0x1301, kEvpEc, 4),
                  Handshake(101, 1, 0x1302, kEvpRsa, 3), Handshake(900, 0, 0x1301, kEvpRsa, 2),
                  Handshake(7, 0, 0x1301, kEvpRsa, 99)};
  u.operations = {Operation(101, USAGE_OP_SIGN, kEvpEc, 72, 6, 20'000),
                  Operation(102, USAGE_OP_SIGN, kEvpEc, 71, 4, 30'000),
                  Operation(101, USAGE_OP_DERIVE, kEvpX25519, 32, 13, 40'000),
                  Operation(900, USAGE_OP_SIGN, kEvpRsa, 256, 2, 250'000),
                  Operation(101, USAGE_OP_CALIBRATE, 0, 0, 1000, 2'000),
                  Operation(7, USAGE_OP_SIGN, kEvpRsa, 256, 5, 1)};
  u.connections = {{101, 1, 3}, {102, 1, 2}, {900, 2, 1}};
  u.totals.hits = 1234;
  u.budget.duty_cycle = 1;
  u.budget.probe_cpu_seconds = 0.0115;
  return u;
}

std::optional<ServiceKey> UsageServiceOf(uint32_t tgid) {
  if (tgid == 7) return std::nullopt;  // the agent
  if (tgid == 900) return ServiceKey{"curl"};
  return ServiceKey{"nginx"};
}

std::string LibraryOf(uint16_t lib) { return lib == 1 ? "openssl-3" : "go"; }

TEST(Usage, LatencyBucketsHoldEverySlotWhole) {
  // Each BPF slot lies inside one fixed bucket: no count is split or moved
  // across a bound, so the fixed histogram is exact at its bounds.
  for (uint32_t i = 0; i < USAGE_HIST_SLOTS; ++i) {
    auto [lo, hi] = usage::SlotBounds(i);
    const size_t b = v1::LatencyBucketOf(hi);
    ASSERT_LT(b, v1::kLatencyFiniteBuckets) << "slot " << i;
    EXPECT_LE(hi, v1::LatencyBucketBoundNs(b)) << "slot " << i;
    if (b > 0) {
      EXPECT_GE(lo, v1::LatencyBucketBoundNs(b - 1)) << "slot " << i;
    }
  }
  EXPECT_EQ(v1::LatencyBucketBoundNs(0), 1024u);
  EXPECT_EQ(v1::LatencyBucketBoundNs(1), 1536u);
  EXPECT_EQ(v1::LatencyBucketBoundNs(2), 2048u);
  EXPECT_EQ(v1::LatencyBucketBoundNs(v1::kLatencyFiniteBuckets - 1), uint64_t{1} << 34);
  std::vector<uint64_t> slots(USAGE_HIST_SLOTS, 0);
  slots[0] = 1;                     // [0, 1) ns
  slots[100] = 2;                   // octave 12, sub-bucket 4: [24576, 26624) ns
  slots[USAGE_HIST_SLOTS - 1] = 3;  // the last: up to 2^34 ns
  const auto buckets = LatencyBuckets(slots);
  EXPECT_EQ(buckets[0], 1u);
  EXPECT_EQ(buckets[10], 2u);  // le 2^15 ns, above 1.5 x 2^14
  EXPECT_EQ(buckets[v1::kLatencyFiniteBuckets - 1], 3u);
  EXPECT_EQ(buckets[v1::kLatencyFiniteBuckets], 0u);
}

TEST(Usage, RowsGoToTheServicesWithTheReportsNames) {
  const aggregate::Attribution profile = SampleProfile();
  auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  EXPECT_EQ(AddUsage(services, SampleUsage(), UsageServiceOf, LibraryOf), 0u);
  ASSERT_TRUE(services.contains({"curl"}));  // 300's, and 900's usage
  const ServiceUsage& nginx = services.at({"nginx"}).usage;
  ASSERT_EQ(nginx.handshakes.size(), 2u);
  const ServiceUsage::Count& full = nginx.handshakes.at(
      {v1::SIDE_SERVER, v1::HANDSHAKE_KIND_FULL, "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519", "ECDSA", "openssl-3"});
  EXPECT_EQ(full.observed, 10u);  // both workers
  EXPECT_DOUBLE_EQ(full.estimated, 10);
  EXPECT_EQ(nginx.handshakes
                .at({v1::SIDE_SERVER, v1::HANDSHAKE_KIND_RESUMED, "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA",
                     "openssl-3"})
                .observed,
            3u);
  // The calibration row and the agent's own operations are left out.
  ASSERT_EQ(nginx.operations.size(), 2u);
  const auto& sign = nginx.operations.at({v1::OPERATION_SIGN, "ECDSA-P256", "openssl-3", true});
  EXPECT_EQ(sign.observed, 10u);
  EXPECT_EQ(sign.cpu_ns, 6u * 20'000 + 4u * 30'000);
  EXPECT_EQ(sign.buckets[9], 6u);   // 20 us: [16384, 24576) ns
  EXPECT_EQ(sign.buckets[10], 4u);  // 30 us: [24576, 32768) ns
  EXPECT_EQ(nginx.operations.at({v1::OPERATION_KEY_EXCHANGE, "X25519", "openssl-3", true}).observed, 13u);
  EXPECT_DOUBLE_EQ(nginx.connections.at("openssl-3").estimated, 5);
  EXPECT_DOUBLE_EQ(services.at({"curl"}).usage.connections.at("go").estimated, 1);
  EXPECT_EQ(nginx.connections.at("openssl-3").resident_bytes, 0u);  // no costs given
  EXPECT_DOUBLE_EQ(full.cpu_seconds, 0);
}

v1::AgentReport UsageReport(const usage::UsageSnapshot& u, const UsageCosts& costs = {});

// Per SampleUsage handshake row, its modelled CPU; per process, its RSS.
UsageCosts SampleCosts() {
  UsageCosts costs;
  costs.handshake_cpu = {{0.006}, {0.004}, {0.0015}, {0.002}, {1.0}};
  costs.resident_bytes = [](uint32_t tgid) -> uint64_t {
    return tgid == 101 ? 30 << 20 : tgid == 102 ? 20 << 20 : 1000;
  };
  return costs;
}

TEST(Usage, HandshakeCpuAndResidentMemoryGoWithTheirRows) {
  const aggregate::Attribution profile = SampleProfile();
  auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  const usage::UsageSnapshot u = SampleUsage();
  EXPECT_EQ(AddUsage(services, u, UsageServiceOf, LibraryOf, SampleCosts()), 0u);
  const ServiceUsage& nginx = services.at({"nginx"}).usage;
  // Both workers' full handshakes are one row: their CPU adds up.
  EXPECT_DOUBLE_EQ(nginx.handshakes
                       .at({v1::SIDE_SERVER, v1::HANDSHAKE_KIND_FULL, "TLSv1.3", "TLS_AES_128_GCM_SHA256", "X25519",
                            "ECDSA", "openssl-3"})
                       .cpu_seconds,
                   0.010);
  // Each worker's memory once beside the connections it holds.
  EXPECT_EQ(nginx.connections.at("openssl-3").resident_bytes, uint64_t{50} << 20);
  EXPECT_EQ(services.at({"curl"}).usage.connections.at("go").resident_bytes, 1000u);

  const WindowInfo window{0, 10'000'000'000, 99, 1'000'000'000 / 99};
  const v1::AgentReport r = EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(u));
  double cpu = 0;
  uint64_t resident = 0;
  for (const v1::Service& s : r.services()) {
    for (const v1::Handshakes& h : s.handshakes()) cpu += h.cpu_seconds();
    for (const v1::Connections& c : s.connections()) resident += c.resident_bytes();
  }
  EXPECT_DOUBLE_EQ(cpu, 0.006 + 0.004 + 0.0015 + 0.002);  // the agent's own row left out
  EXPECT_EQ(resident, (uint64_t{50} << 20) + 1000);

  AgentMetrics metrics;
  metrics.AddReport(r);
  metrics.AddReport(r);
  std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("tlsprof_handshake_cpu_seconds_total{cert_key_type=\"ECDSA\",kind=\"full\","
                              "library=\"openssl-3\",service=\"nginx\"} 0.02"));
  EXPECT_THAT(text, HasSubstr("tlsprof_handshake_cpu_seconds_total{cert_key_type=\"RSA\",kind=\"resumed\","
                              "library=\"openssl-3\",service=\"nginx\"} 0.003"));
  EXPECT_THAT(text, HasSubstr("tlsprof_tls_resident_memory_bytes{library=\"openssl-3\",service=\"nginx\"} 52428800"));
  EXPECT_THAT(text, HasSubstr("tlsprof_tls_resident_memory_bytes{library=\"go\",service=\"curl\"} 1000"));
  // A gauge of the last window: the series of processes gone go away with their connections.
  usage::UsageSnapshot later = u;
  later.connections = {{101, 1, 1}};
  services = GroupServices(profile, profile.scope_samples, ServiceOf);
  AddUsage(services, later, UsageServiceOf, LibraryOf, SampleCosts());
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(later)));
  text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("tlsprof_tls_resident_memory_bytes{library=\"openssl-3\",service=\"nginx\"} 31457280"));
  EXPECT_THAT(text, Not(HasSubstr("tlsprof_tls_resident_memory_bytes{library=\"go\"")));
  // The collector takes it, and a cost that is not a finite CPU time is sent as 0.
  EXPECT_EQ(collector::ValidateReport(UsageReport(u, SampleCosts()), 0), std::nullopt);
  UsageCosts odd = SampleCosts();
  odd.handshake_cpu[0].cpu_seconds = std::nan("");
  odd.handshake_cpu[1].cpu_seconds = -1;
  const v1::AgentReport sanitized = UsageReport(u, odd);
  EXPECT_EQ(collector::ValidateReport(sanitized, 0), std::nullopt);
  for (const v1::Service& s : sanitized.services()) {
    for (const v1::Handshakes& h : s.handshakes()) EXPECT_GE(h.cpu_seconds(), 0);
  }
}

TEST(Usage, ReportCarriesTheRowsAndTheUsageBlock) {
  const aggregate::Attribution profile = SampleProfile();
  auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  const usage::UsageSnapshot u = SampleUsage();
  AddUsage(services, u, UsageServiceOf, LibraryOf);
  const WindowInfo window{0, 10'000'000'000, 99, 1'000'000'000 / 99};
  const v1::AgentReport r = EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(u));
  ASSERT_TRUE(r.has_usage());
  EXPECT_DOUBLE_EQ(r.usage().duty_cycle(), 1);
  EXPECT_DOUBLE_EQ(r.usage().probe_cpu_seconds(), 0.0115);
  EXPECT_EQ(r.usage().probe_hits(), 1234u);
  uint64_t handshakes = 0, signs = 0;
  for (const v1::Service& s : r.services()) {
    for (const v1::Handshakes& h : s.handshakes()) {
      handshakes += h.observed();
      EXPECT_DOUBLE_EQ(h.estimated(), static_cast<double>(h.observed()));
      for (const std::string& l : {h.version(), h.cipher_suite(), h.group(), h.cert_key_type(), h.library()})
        EXPECT_TRUE(IsValidLabel(l)) << l;
    }
    for (const v1::CryptoOperations& o : s.operations()) {
      ASSERT_EQ(o.latency_buckets_size(), static_cast<int>(v1::kLatencyBuckets));
      uint64_t in_buckets = 0;
      for (uint64_t n : o.latency_buckets()) in_buckets += n;
      EXPECT_EQ(in_buckets, o.observed()) << o.algorithm();
      if (o.operation() == v1::OPERATION_SIGN) signs += o.observed();
      if (s.name() == "curl") {
        EXPECT_EQ(o.algorithm(), "RSA-2048");
        EXPECT_DOUBLE_EQ(o.cpu_seconds(), 2 * 250e-6);
      }
    }
  }
  EXPECT_EQ(handshakes, 6u + 4 + 3 + 2);
  EXPECT_EQ(signs, 6u + 4 + 2);
  // Without --usage nothing of it is encoded, and a usage-only service is left out.
  const v1::AgentReport plain = EncodeReport(services, profile.scope_samples, window, {}, {});
  EXPECT_FALSE(plain.has_usage());
  for (const v1::Service& s : plain.services()) EXPECT_EQ(s.handshakes_size() + s.operations_size(), 0);
}

// The report a window gives, for the collector's validation.
v1::AgentReport UsageReport(const usage::UsageSnapshot& u, const UsageCosts& costs) {
  const aggregate::Attribution profile = SampleProfile();
  auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  AddUsage(services, u, UsageServiceOf, LibraryOf, costs);
  v1::Host host;
  host.set_hostname("h1");
  host.set_cpus(2);
  const WindowInfo window{1'000'000'000, 11'000'000'000, 99, 1'000'000'000 / 99};
  v1::AgentReport r = EncodeReport(services, profile.scope_samples, window, host, {}, UsageStatsOf(u));
  r.set_agent_instance(std::string(16, 'i'));
  r.set_sequence(1);
  return r;
}

TEST(Usage, EveryReportPassesTheCollectorsValidation) {
  EXPECT_EQ(collector::ValidateReport(UsageReport(SampleUsage()), 0), std::nullopt);
  // Whatever the usage side computes, the report stays acceptable: a
  // rejected one would lose the window's CPU rows too.
  usage::UsageSnapshot odd = SampleUsage();
  odd.handshakes[0].estimated = std::nan("");
  odd.handshakes[1].estimated = 1;  // below its 4 observed
  odd.operations[0].estimated = -std::numeric_limits<double>::infinity();
  odd.connections[0].estimated = std::nan("");
  odd.budget.duty_cycle = 1.5;
  odd.budget.relative_error = std::nan("");
  odd.budget.probe_cpu_seconds = -1;
  const v1::AgentReport r = UsageReport(odd);
  EXPECT_EQ(collector::ValidateReport(r, 0), std::nullopt);
  EXPECT_DOUBLE_EQ(r.usage().duty_cycle(), 1);
  EXPECT_DOUBLE_EQ(r.usage().relative_error(), 0);
  for (const v1::Service& s : r.services()) {
    for (const v1::Handshakes& h : s.handshakes()) EXPECT_GE(h.estimated(), static_cast<double>(h.observed()));
  }
  odd.budget.duty_cycle = std::nan("");
  EXPECT_DOUBLE_EQ(UsageReport(odd).usage().duty_cycle(), 1);
  odd.budget.duty_cycle = 0;  // probes off all window
  EXPECT_EQ(collector::ValidateReport(UsageReport(odd), 0), std::nullopt);
}

TEST(Usage, NewServicesPastTheCapGoToOverflow) {
  ServiceMap services;
  for (size_t i = 0; i < kMaxServices; ++i) services[{"svc" + std::to_string(i)}].busy_samples = 1;
  usage::UsageSnapshot u;
  u.handshakes = {Handshake(5, 0, 0x1301, kEvpEc, 1), Handshake(6, 0, 0x1301, kEvpEc, 2)};
  AddUsage(
      services, u, [](uint32_t tgid) -> std::optional<ServiceKey> { return ServiceKey{tgid == 5 ? "svc3" : "late"}; },
      LibraryOf);
  EXPECT_EQ(services.size(), kMaxServices + 1);
  EXPECT_EQ(services.at({"svc3"}).usage.handshakes.begin()->second.observed, 1u);
  EXPECT_EQ(services.at({"(overflow)"}).usage.handshakes.begin()->second.observed, 2u);
  EXPECT_FALSE(services.contains({"late"}));
}

TEST(Usage, RowsPastThePerReportCapAreDropped) {
  ServiceMap services;
  usage::UsageSnapshot u;
  for (uint32_t len = 1; len <= v1::kMaxOperationRows + 10; ++len) {
    u.operations.push_back(Operation(101, USAGE_OP_DERIVE, 28, len, 1, 1000));  // DH: FFDHE-<len*8>
  }
  EXPECT_EQ(AddUsage(services, u, UsageServiceOf, LibraryOf), 10u);
  EXPECT_EQ(services.at({"nginx"}).usage.operations.size(), v1::kMaxOperationRows);
}

TEST(Usage, MetricsOfTheAgentsHost) {
  AgentMetrics metrics;
  const aggregate::Attribution profile = SampleProfile();
  auto services = GroupServices(profile, profile.scope_samples, ServiceOf);
  const usage::UsageSnapshot u = SampleUsage();
  AddUsage(services, u, UsageServiceOf, LibraryOf);
  const WindowInfo window{0, 10'000'000'000, 99, 1'000'000'000 / 99};
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(u)));
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(u)));
  metrics.AddWindow({.usage = true,
                     .probe_duty_cycle = 0.5,
                     .probe_cpu_seconds = 0.25,
                     .probe_hits = 100,
                     .probe_budget_cpu_seconds = 0.1,
                     .probe_toggles = 4,
                     .probe_budget_share = 0.005});
  std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("tlsprof_handshakes_total{cert_key_type=\"ECDSA\",cipher_suite=\"TLS_AES_128_GCM_"
                              "SHA256\",group=\"X25519\",kind=\"full\",library=\"openssl-3\",service=\"nginx\","
                              "side=\"server\",version=\"TLSv1.3\"} 20"));
  EXPECT_THAT(text, HasSubstr("tlsprof_crypto_operations_total{algorithm=\"ECDSA-P256\",in_handshake=\"true\","
                              "library=\"openssl-3\",operation=\"sign\",service=\"nginx\"} 20"));
  // 2 x (6 x 20 us + 4 x 30 us) = 0.00048 s
  EXPECT_THAT(text, HasSubstr("tlsprof_crypto_operation_cpu_seconds_total{algorithm=\"ECDSA-P256\",in_handshake="
                              "\"true\",library=\"openssl-3\",operation=\"sign\",service=\"nginx\"} 0.00048"));
  EXPECT_THAT(text, HasSubstr("tlsprof_crypto_operation_latency_seconds_count{algorithm=\"ECDSA-P256\",in_handshake="
                              "\"true\",library=\"openssl-3\",operation=\"sign\",service=\"nginx\"} 20"));
  EXPECT_THAT(text, HasSubstr("tlsprof_crypto_operation_latency_seconds_bucket{algorithm=\"ECDSA-P256\",in_"
                              "handshake=\"true\",library=\"openssl-3\",operation=\"sign\",service=\"nginx\",le=\"3."
                              "2768e-05\"} 20"));
  EXPECT_THAT(text, HasSubstr("tlsprof_tls_connections{library=\"openssl-3\",service=\"nginx\"} 5"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_duty_cycle 0.5"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_cpu_seconds_total 0.25"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_hits_total 100"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_budget_cpu_seconds_total 0.1"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_toggles_total 4"));
  EXPECT_THAT(text, HasSubstr("tlsprof_agent_usage_probe_budget_ratio 0.005"));
  // The gauge is the last window's: connections of processes gone go away.
  usage::UsageSnapshot later = u;
  later.connections = {{101, 1, 1}};
  services = GroupServices(profile, profile.scope_samples, ServiceOf);
  AddUsage(services, later, UsageServiceOf, LibraryOf);
  metrics.AddReport(EncodeReport(services, profile.scope_samples, window, {}, {}, UsageStatsOf(later)));
  text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("tlsprof_tls_connections{library=\"openssl-3\",service=\"nginx\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("tlsprof_tls_connections{library=\"go\"")));
}

TEST(Metrics, ListenAddress) {
  EXPECT_TRUE(CheckListenAddress("127.0.0.1:9464").ok());
  EXPECT_TRUE(CheckListenAddress("[::1]:9464").ok());
  EXPECT_TRUE(CheckListenAddress("0.0.0.0:1").ok());
  for (const char* bad :
       {"9464", ":9464", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:http", "::1:9464", "host:94x"}) {
    EXPECT_FALSE(CheckListenAddress(bad).ok()) << bad;
  }
}

TEST(Metrics, PortInUseIsAnError) {
  AgentMetrics first;
  ASSERT_TRUE(first.Serve("127.0.0.1:39464").ok());
  AgentMetrics second;
  auto st = second.Serve("127.0.0.1:39464");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message, HasSubstr("cannot listen"));
}

}  // namespace
}  // namespace tlsprof::wire
