#include "collector/ingest/validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "collector/ingest/test_report.h"
#include "proto/tlsprof/v1/usage_wire.h"

namespace tlsprof::collector {
namespace {

using testing::kTestNowNs;
using testing::MakeReport;
using testing::MakeUsageReport;
using testing::WithUsage;

TEST(Validate, AcceptsTheTestReport) { EXPECT_EQ(ValidateReport(MakeReport(1), kTestNowNs), std::nullopt); }

TEST(Validate, AcceptsUsageTelemetry) {
  v1::AgentReport r = MakeUsageReport(1);
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
  // A service with usage rows and no samples (a process never sampled), an
  // operation row without a histogram, a duty cycle below 1 with its scaled
  // estimates, unknown side and kind.
  v1::Service* s = r.add_services();
  s->set_name("curl");
  *s->add_handshakes() = r.services(0).handshakes(0);
  s->mutable_handshakes(0)->set_side(v1::SIDE_UNKNOWN);
  s->mutable_handshakes(0)->set_kind(v1::HANDSHAKE_KIND_UNKNOWN);
  s->mutable_handshakes(0)->set_estimated(40);
  *s->add_operations() = r.services(0).operations(0);
  s->mutable_operations(0)->clear_latency_buckets();
  r.mutable_usage()->set_duty_cycle(0.25);
  r.mutable_usage()->set_relative_error(0.08);
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
}

struct Rejection {
  const char* name;
  std::function<void(v1::AgentReport&)> mutate;
  const char* message;
};

// Each rule of docs/fleet.md's step 4, broken on its own, with the message
// the agent gets.
const Rejection kRejections[] = {
    {"instance_short", [](auto& r) { r.set_agent_instance("short"); }, "agent_instance: must be 16 bytes, got 5"},
    {"sequence_zero", [](auto& r) { r.set_sequence(0); }, "sequence: must be >= 1"},
    {"hostname_empty", [](auto& r) { r.mutable_host()->set_hostname(""); },
     "host.hostname: must be 1-253 characters of [A-Za-z0-9._:-]"},
    {"hostname_injection", [](auto& r) { r.mutable_host()->set_hostname("h\"}"); },
     "host.hostname: must be 1-253 characters of [A-Za-z0-9._:-]"},
    {"cpus_zero", [](auto& r) { r.mutable_host()->set_cpus(0); }, "host.cpus: must be >= 1"},
    {"cpus_beyond_any_kernel", [](auto& r) { r.mutable_host()->set_cpus(kMaxHostCpus + 1); },
     "host.cpus: 8193 exceeds 8192, the most CPUs a Linux kernel supports"},
    {"window_empty", [](auto& r) { r.mutable_window()->set_start_unix_ns(r.window().end_unix_ns()); },
     "window: end_unix_ns must be > start_unix_ns"},
    {"window_too_long",
     [](auto& r) { r.mutable_window()->set_start_unix_ns(r.window().end_unix_ns() - kMaxWindowNs - 1); },
     "window: longer than 1 h"},
    {"frequency_zero", [](auto& r) { r.mutable_window()->set_frequency_hz(0); },
     "window.frequency_hz: must be 1-1000000"},
    {"period_wrong", [](auto& r) { r.mutable_window()->set_period_ns(1'000'000'000 / 99 + 2); },
     "window.period_ns: must be 1e9/frequency_hz = 10101010 (+-1), got 10101012"},
    // 2 CPUs x 10 s x 99 Hz x 1.5 = 2970.
    {"busy_too_many", [](auto& r) { r.set_busy_samples(2971); },
     "busy_samples: 2971 exceeds 1.5 x cpus x seconds x frequency = 2970"},
    {"service_busy_too_many", [](auto& r) { r.mutable_services(0)->set_busy_samples(2971); },
     "services[0].busy_samples: 2971 exceeds 1.5 x cpus x seconds x frequency = 2970"},
    {"services_sum_too_many",
     [](auto& r) {
       r.mutable_services(0)->set_busy_samples(2000);
       v1::Service* s = r.add_services();
       s->set_name("(non-tls)");
       s->set_busy_samples(1000);
     },
     "services: busy_samples add up to 3000, more than 1.5 x cpus x seconds x frequency = 2970"},
    {"tls_over_busy", [](auto& r) { r.mutable_services(0)->set_busy_samples(200); },
     "services[0].tls_samples: 300 exceeds busy_samples 200"},
    {"tls_sum_mismatch", [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_samples(299); },
     "services[0].tls_samples: 300 != sum of its tls[].samples"},
    {"bucket_unspecified", [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_bucket(v1::BUCKET_UNSPECIFIED); },
     "services[0].tls[0].bucket: must be a specified tlsprof.v1.Bucket, got 0"},
    {"bucket_unknown_number",
     [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_bucket(static_cast<v1::Bucket>(42)); },
     "services[0].tls[0].bucket: must be a specified tlsprof.v1.Bucket, got 42"},
    {"phase_unspecified", [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_phase(v1::PHASE_UNSPECIFIED); },
     "services[0].tls[0].phase: must be a specified tlsprof.v1.Phase, got 0"},
    {"service_name_injection", [](auto& r) { r.mutable_services(0)->set_name("a\"} evil{"); },
     "services[0].name: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"service_name_empty", [](auto& r) { r.mutable_services(0)->set_name(""); },
     "services[0].name: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"algorithm_too_long", [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_algorithm(std::string(65, 'A')); },
     "services[0].tls[0].algorithm: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"library_newline", [](auto& r) { r.mutable_services(0)->mutable_tls(0)->set_library("openssl\n"); },
     "services[0].tls[0].library: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"container_id_upper_case", [](auto& r) { r.mutable_services(0)->set_container_id("3F1C6A9E2B7D"); },
     "services[0].container_id: must be empty or 1-64 lowercase hex digits"},
    {"container_id_too_long", [](auto& r) { r.mutable_services(0)->set_container_id(std::string(65, 'a')); },
     "services[0].container_id: must be empty or 1-64 lowercase hex digits"},
    {"container_id_injection", [](auto& r) { r.mutable_services(0)->set_container_id("ab\"}x{"); },
     "services[0].container_id: must be empty or 1-64 lowercase hex digits"},
    {"pod_uid_underscored", [](auto& r) { r.mutable_services(0)->set_pod_uid("8d4c0d6e_3f1a_4b2c_9d8e_7f6a5b4c3d2e"); },
     "services[0].pod_uid: must be empty or a lowercase UUID (8-4-4-4-12 hex digits)"},
    {"pod_uid_upper_case", [](auto& r) { r.mutable_services(0)->set_pod_uid("8D4C0D6E-3F1A-4B2C-9D8E-7F6A5B4C3D2E"); },
     "services[0].pod_uid: must be empty or a lowercase UUID (8-4-4-4-12 hex digits)"},
    {"pod_uid_short", [](auto& r) { r.mutable_services(0)->set_pod_uid("8d4c0d6e-3f1a-4b2c-9d8e"); },
     "services[0].pod_uid: must be empty or a lowercase UUID (8-4-4-4-12 hex digits)"},
    // Usage telemetry: the same rules for its labels, finite non-negative
    // numbers within bounds, consistent histograms, and the row caps.
    {"usage_rows_without_block",
     [](auto& r) {
       WithUsage(r);
       r.clear_usage();
     },
     "services[0]: usage rows (handshakes, operations, connections) need the report's usage block"},
    {"usage_duty_cycle_negative", [](auto& r) { WithUsage(r).mutable_usage()->set_duty_cycle(-0.5); },
     "usage.duty_cycle: must be in [0, 1], got -0.5"},
    {"usage_duty_cycle_above_one", [](auto& r) { WithUsage(r).mutable_usage()->set_duty_cycle(1.5); },
     "usage.duty_cycle: must be in [0, 1], got 1.5"},
    {"usage_duty_cycle_nan", [](auto& r) { WithUsage(r).mutable_usage()->set_duty_cycle(std::nan("")); },
     "usage.duty_cycle: must be in [0, 1], got nan"},
    {"usage_relative_error_negative", [](auto& r) { WithUsage(r).mutable_usage()->set_relative_error(-0.1); },
     "usage.relative_error: must be a finite number >= 0, got -0.1"},
    // 2 CPUs x 10 s x 1.5 = 30 CPU-seconds.
    {"usage_probe_cpu_too_much", [](auto& r) { WithUsage(r).mutable_usage()->set_probe_cpu_seconds(31); },
     "usage.probe_cpu_seconds: 31 exceeds 30"},
    {"usage_budget_cpu_infinite",
     [](auto& r) { WithUsage(r).mutable_usage()->set_budget_cpu_seconds(std::numeric_limits<double>::infinity()); },
     "usage.budget_cpu_seconds: must be a finite number >= 0, got inf"},
    {"handshake_side_unspecified",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_side(v1::SIDE_UNSPECIFIED); },
     "services[0].handshakes[0].side: must be a specified tlsprof.v1.Side, got 0"},
    {"handshake_kind_unknown_number",
     [](auto& r) {
       WithUsage(r).mutable_services(0)->mutable_handshakes(1)->set_kind(static_cast<v1::HandshakeKind>(9));
     },
     "services[0].handshakes[1].kind: must be a specified tlsprof.v1.HandshakeKind, got 9"},
    {"handshake_cipher_suite_injection",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_cipher_suite("x\"} evil{"); },
     "services[0].handshakes[0].cipher_suite: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"handshake_version_empty",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_version(""); },
     "services[0].handshakes[0].version: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"handshake_library_too_long",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_library(std::string(65, 'l')); },
     "services[0].handshakes[0].library: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"handshake_estimated_below_observed",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_estimated(9); },
     "services[0].handshakes[0].estimated: 9 is below observed 10 (estimates scale the observed count up)"},
    {"handshake_estimated_infinite",
     [](auto& r) {
       WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_estimated(std::numeric_limits<double>::infinity());
     },
     "services[0].handshakes[0].estimated: must be a finite number >= 0, got inf"},
    {"handshake_estimated_without_observed",
     [](auto& r) {
       v1::Handshakes* h = WithUsage(r).mutable_services(0)->mutable_handshakes(0);
       h->set_observed(0);
       h->set_estimated(3);
     },
     "services[0].handshakes[0].estimated: 3 with observed 0 (estimates scale the observed count up)"},
    // 1e6 x 2 CPUs x 10 s.
    {"handshake_observed_too_many",
     [](auto& r) {
       v1::Handshakes* h = WithUsage(r).mutable_services(0)->mutable_handshakes(0);
       h->set_observed(20'000'001);
       h->set_estimated(20'000'001);
     },
     "services[0].handshakes[0].observed: 20000001 exceeds 20000000 (1e6 per CPU-second of the window)"},
    {"operation_unspecified",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_operations(0)->set_operation(v1::OPERATION_UNSPECIFIED); },
     "services[0].operations[0].operation: must be a specified tlsprof.v1.Operation, got 0"},
    {"operation_algorithm_newline",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_operations(0)->set_algorithm("RSA\n"); },
     "services[0].operations[0].algorithm: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"operation_cpu_negative",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_operations(0)->set_cpu_seconds(-1); },
     "services[0].operations[0].cpu_seconds: must be a finite number >= 0, got -1"},
    {"operation_buckets_short",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_operations(0)->mutable_latency_buckets()->RemoveLast(); },
     "services[0].operations[0].latency_buckets: must be empty or hold exactly 50 buckets, got 49"},
    {"operation_buckets_dont_add_up",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_operations(0)->set_latency_buckets(0, 1); },
     "services[0].operations[0].latency_buckets: must add up to observed 10"},
    {"operation_buckets_overflow",
     [](auto& r) {
       v1::CryptoOperations* o = WithUsage(r).mutable_services(0)->mutable_operations(0);
       o->set_latency_buckets(0, std::numeric_limits<uint64_t>::max());
       o->set_latency_buckets(1, 11);  // wraps the sum around to 10
     },
     "services[0].operations[0].latency_buckets: must add up to observed 10"},
    {"connections_negative",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_connections(0)->set_estimated(-1); },
     "services[0].connections[0].estimated: must be a finite number >= 0, got -1"},
    {"connections_too_many",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_connections(0)->set_estimated(1e9); },
     "services[0].connections[0].estimated: 1000000000 exceeds 100000000"},
    {"handshake_cpu_negative",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_cpu_seconds(-1); },
     "services[0].handshakes[0].cpu_seconds: must be a finite number >= 0, got -1"},
    {"handshake_cpu_not_finite",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_cpu_seconds(std::nan("")); },
     "services[0].handshakes[0].cpu_seconds: must be a finite number >= 0, got nan"},
    {"handshake_cpu_over_the_window",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_handshakes(0)->set_cpu_seconds(31); },
     "services[0].handshakes[0].cpu_seconds: 31 exceeds 30"},
    {"connections_resident_absurd",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_connections(0)->set_resident_bytes(uint64_t{1} << 60); },
     "services[0].connections[0].resident_bytes: 1152921504606846976 exceeds 1125899906842624 (1 PiB)"},
    {"connections_library_injection",
     [](auto& r) { WithUsage(r).mutable_services(0)->mutable_connections(0)->set_library("a=b"); },
     "services[0].connections[0].library: must be 1-64 characters of [A-Za-z0-9._:/()+ -]"},
    {"handshake_rows_over_the_cap",
     [](auto& r) {
       WithUsage(r);
       for (size_t i = 0; i < v1::kMaxHandshakeRows; ++i)
         *r.mutable_services(0)->add_handshakes() = r.services(0).handshakes(0);
     },
     "services[].handshakes: more than 4096 rows in one report"},
};

class ValidateRejects : public ::testing::TestWithParam<Rejection> {};

TEST_P(ValidateRejects, WithItsMessage) {
  v1::AgentReport r = MakeReport(1);
  GetParam().mutate(r);
  std::optional<std::string> error = ValidateReport(r, kTestNowNs);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(*error, GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(Rules, ValidateRejects, ::testing::ValuesIn(kRejections),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Validate, BoundariesAreInclusive) {
  v1::AgentReport r = MakeReport(1);
  r.set_busy_samples(2970);
  r.mutable_window()->set_period_ns(1'000'000'000 / 99 + 1);
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
  r.mutable_window()->set_start_unix_ns(r.window().end_unix_ns() - kMaxWindowNs);
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
  r.mutable_host()->set_cpus(kMaxHostCpus);
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
}

// A host whose clock is wrong still has its CPU counted: the window's
// position in time is not checked, only its length (docs/fleet.md, "Clock skew").
TEST(Validate, AcceptsWindowsOfASkewedClock) {
  const int64_t hour = 3600LL * 1'000'000'000;
  for (int64_t skew : {hour, 24 * hour, -24 * hour, 365 * 24 * hour}) {
    v1::AgentReport r = MakeReport(1);
    r.mutable_window()->set_end_unix_ns(kTestNowNs + skew);
    r.mutable_window()->set_start_unix_ns(kTestNowNs + skew - 10'000'000'000);
    EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt) << skew;
    r.mutable_window()->set_start_unix_ns(r.window().end_unix_ns() - kMaxWindowNs - 1);
    EXPECT_EQ(ValidateReport(r, kTestNowNs), "window: longer than 1 h") << skew;
  }
}

TEST(Validate, LabelValues) {
  for (const char* ok : {"(non-tls)", "P-256 (ECDSA or ECDHE)", "openssl-1.1", "a/b:c+d_e.f", "x"}) {
    EXPECT_TRUE(IsValidLabelValue(ok)) << ok;
  }
  for (const char* bad : {"", "a\"b", "a}b", "a{b", "a\\b", "a=b", "a,b", "\xc3\xa9"}) {
    EXPECT_FALSE(IsValidLabelValue(bad)) << bad;
  }
  EXPECT_TRUE(IsValidLabelValue(std::string(64, 'a')));
  EXPECT_FALSE(IsValidLabelValue(std::string(65, 'a')));
}

TEST(Validate, ContainerFields) {
  v1::AgentReport r = MakeReport(1);
  r.mutable_services(0)->set_container_id("3f1c6a9e2b7d");
  r.mutable_services(0)->set_pod_uid("8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2e");
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
  r.mutable_services(0)->set_container_id(std::string(64, 'f'));  // a full id
  r.mutable_services(0)->clear_pod_uid();                         // a container outside Kubernetes
  EXPECT_EQ(ValidateReport(r, kTestNowNs), std::nullopt);
  EXPECT_TRUE(IsValidContainerId(""));
  EXPECT_TRUE(IsValidPodUid(""));
  EXPECT_FALSE(IsValidPodUid("8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2g"));
  EXPECT_FALSE(IsValidPodUid("8d4c0d6e-3f1a-4b2c-9d8e-7f6a5b4c3d2e0"));
  EXPECT_FALSE(IsValidPodUid("8d4c0d6e3-f1a-4b2c-9d8e-7f6a5b4c3d2e"));
}

}  // namespace
}  // namespace tlsprof::collector
