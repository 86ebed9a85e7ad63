// A valid AgentReport for the collector's tests.
#pragma once

#include <string>

#include "tlsprof/v1/report.pb.h"

namespace tlsprof::collector::testing {

inline constexpr int64_t kTestNowNs = 1'800'000'000'000'000'000;  // 2027-01-15

// 10 s window ending at `end_ns` on 2 CPUs at 99 Hz; one service "nginx" with
// 800 busy samples, 300 of them AES-GCM record-layer; 1000 busy on the host.
inline v1::AgentReport MakeReport(uint64_t sequence, std::string instance = std::string(16, 'i'),
                                  int64_t end_ns = kTestNowNs) {
  v1::AgentReport r;
  r.set_agent_instance(instance);
  r.set_sequence(sequence);
  r.mutable_host()->set_hostname("host-1");
  r.mutable_host()->set_cpus(2);
  r.mutable_window()->set_start_unix_ns(end_ns - 10'000'000'000);
  r.mutable_window()->set_end_unix_ns(end_ns);
  r.mutable_window()->set_frequency_hz(99);
  r.mutable_window()->set_period_ns(1'000'000'000 / 99);
  r.set_busy_samples(1000);
  v1::Service* s = r.add_services();
  s->set_name("nginx");
  s->set_busy_samples(800);
  s->set_tls_samples(300);
  v1::TlsCpu* t = s->add_tls();
  t->set_bucket(v1::BUCKET_CIPHER);
  t->set_algorithm("AES-GCM");
  t->set_phase(v1::PHASE_RECORD);
  t->set_library("openssl-3");
  t->set_samples(300);
  return r;
}

// Adds usage telemetry to MakeReport's report: nginx's 10 full TLS 1.3
// ECDSA and 5 resumed handshakes, 10 ECDSA-P256 signatures (8 in the
// 24.576-32.768 us bucket, 2 in 49.152-65.536 us; 0.00025 on-CPU seconds), 7
// live connections, and the usage block (duty cycle 1).
inline v1::AgentReport& WithUsage(v1::AgentReport& r) {
  v1::Service* s = r.mutable_services(0);
  auto handshake = [s](v1::HandshakeKind kind, uint64_t n) {
    v1::Handshakes* h = s->add_handshakes();
    h->set_side(v1::SIDE_SERVER);
    h->set_kind(kind);
    h->set_version("TLSv1.3");
    h->set_cipher_suite("TLS_AES_128_GCM_SHA256");
    h->set_group("X25519");
    h->set_cert_key_type("ECDSA");
    h->set_library("openssl-3");
    h->set_observed(n);
    h->set_estimated(static_cast<double>(n));
  };
  handshake(v1::HANDSHAKE_KIND_FULL, 10);
  handshake(v1::HANDSHAKE_KIND_RESUMED, 5);
  v1::CryptoOperations* o = s->add_operations();
  o->set_operation(v1::OPERATION_SIGN);
  o->set_algorithm("ECDSA-P256");
  o->set_library("openssl-3");
  o->set_in_handshake(true);
  o->set_observed(10);
  o->set_estimated(10);
  o->set_cpu_seconds(0.00025);
  for (int i = 0; i < 50; ++i) o->add_latency_buckets(i == 10 ? 8 : i == 12 ? 2 : 0);
  v1::Connections* c = s->add_connections();
  c->set_library("openssl-3");
  c->set_estimated(7);
  r.mutable_usage()->set_duty_cycle(1);
  r.mutable_usage()->set_probe_cpu_seconds(0.002);
  r.mutable_usage()->set_probe_hits(100);
  r.mutable_usage()->set_budget_cpu_seconds(0.1);
  return r;
}

inline v1::AgentReport MakeUsageReport(uint64_t sequence, std::string instance = std::string(16, 'i'),
                                       int64_t end_ns = kTestNowNs) {
  v1::AgentReport r = MakeReport(sequence, std::move(instance), end_ns);
  return WithUsage(r);
}

}  // namespace tlsprof::collector::testing
