// No privileges: services, the report encoding, the metrics and the flag checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <tuple>

#include "agent/daemon/daemon.h"
#include "agent/daemon/encode.h"
#include "agent/daemon/metrics.h"
#include "agent/daemon/services.h"

namespace tlsprof::daemon {
namespace {

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

aggregate::ProcessProfile Process(pid_t pid, std::string comm, uint64_t busy) {
  aggregate::ProcessProfile p;
  p.pid = pid;
  p.comm = std::move(comm);
  p.samples = busy;
  return p;
}

void AddTls(aggregate::ProcessProfile& p, Bucket b, std::string_view alg, Phase ph, LibraryKind lib, uint64_t n) {
  p.crypto.Add({b, alg}, ph, lib, n);
}

// Two TLS processes of one unit, one Go process named by its comm, a process
// mapping a TLS library without TLS samples, two plain processes, and busy
// samples no process entry holds (the pid map was full).
aggregate::Profile SampleProfile() {
  aggregate::Profile profile;
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

ServiceKey ServiceOf(const aggregate::ProcessProfile& p) {
  return {ServiceName(p.comm == "nginx" ? "/system.slice/nginx.service" : "", p.comm), "", ""};
}

ServiceKey CommOf(const aggregate::ProcessProfile& p) { return {p.comm, "", ""}; }

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
  const aggregate::Profile profile = SampleProfile();
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
  aggregate::Profile profile;
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
  const aggregate::Profile profile = SampleProfile();
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
  aggregate::Profile profile;
  for (pid_t pid : {1, 2, 3}) {
    auto p = Process(pid, "envoy", 100);
    AddTls(p, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kBoringSSL, 10 * pid);
    profile.processes[pid] = p;
  }
  profile.processes[4] = Process(4, "sleep", 50);  // no TLS: (non-tls), whatever its container
  profile.scope_samples = 350;
  for (bool labels : {true, false}) {
    const auto services = GroupServices(profile, profile.scope_samples, [&](const aggregate::ProcessProfile& p) {
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
  aggregate::Profile profile;
  for (pid_t pid = 1; pid <= 100; ++pid) {
    auto p = Process(pid, "worker", static_cast<uint64_t>(pid));
    AddTls(p, Bucket::kCipher, "AES-128-GCM", Phase::kRecord, LibraryKind::kOpenSSL3, 1);
    profile.processes[pid] = p;
    profile.scope_samples += static_cast<uint64_t>(pid);
  }
  // One image, 100 containers: one service name, 100 keys.
  const auto services = GroupServices(profile, profile.scope_samples, [](const aggregate::ProcessProfile& p) {
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

TEST(Validate, Flags) {
  Options o;
  EXPECT_TRUE(Validate(o).ok());
  o.interval_seconds = 0;
  EXPECT_THAT(Validate(o).error().message, HasSubstr("--interval"));
  o = {};
  o.collector = "collector:4317";
  EXPECT_THAT(Validate(o).error().message, HasSubstr("--insecure"));
  o.insecure = true;
  EXPECT_TRUE(Validate(o).ok());
  o.insecure = false;
  o.tls_ca = "ca.pem";
  o.tls_cert = "agent.pem";
  EXPECT_THAT(Validate(o).error().message, HasSubstr("--tls-key"));
  o.tls_key = "agent.key";
  EXPECT_TRUE(Validate(o).ok());
  o.insecure = true;
  EXPECT_FALSE(Validate(o).ok());
  o = {};
  o.metrics_listen = "nonsense";
  EXPECT_THAT(Validate(o).error().message, HasSubstr("--metrics-listen"));
}

}  // namespace
}  // namespace tlsprof::daemon
