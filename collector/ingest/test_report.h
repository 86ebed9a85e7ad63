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

}  // namespace tlsprof::collector::testing
