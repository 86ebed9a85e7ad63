#include "common/metrics/metric_table.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <regex>
#include <set>
#include <string>

#include "common/metrics/prometheus.h"

namespace tlsprof::metrics {
namespace {

TEST(MetricTable, NamesAreUniqueAndValidPrometheusNames) {
  std::set<std::string_view> names;
  const std::regex valid("tlsprof_[a-z0-9_]+");
  for (const Metric* m : kAll) {
    EXPECT_TRUE(names.insert(m->name).second) << m->name << " is in the table twice";
    EXPECT_TRUE(std::regex_match(std::string(m->name), valid)) << m->name;
  }
}

TEST(MetricTable, CountersAndOnlyCountersEndInTotal) {
  for (const Metric* m : kAll) {
    EXPECT_EQ(m->type == Type::kCounter, m->name.ends_with("_total")) << m->name;
  }
}

TEST(MetricTable, LabelNamesAreValidAndUniquePerMetric) {
  const std::regex valid("[a-z][a-z0-9_]*");
  for (const Metric* m : kAll) {
    std::set<std::string_view> seen;
    for (std::string_view label : m->labels) {
      EXPECT_TRUE(std::regex_match(std::string(label), valid)) << m->name << ": " << label;
      EXPECT_TRUE(seen.insert(label).second) << m->name << ": " << label << " twice";
      // A histogram's bucket label is the exposition's, not the metric's.
      EXPECT_NE(label, "le") << m->name;
    }
  }
}

TEST(MetricTable, HelpIsOneLineOfText) {
  for (const Metric* m : kAll) {
    EXPECT_FALSE(m->help.empty()) << m->name;
    EXPECT_EQ(m->help.find_first_of("\n\\"), std::string_view::npos) << m->name;
  }
}

TEST(MetricTable, HealthMetricsBelongToTheSideTheyAreNamedFor) {
  for (const Metric* m : kAll) {
    if (m->name.starts_with("tlsprof_agent_")) {
      EXPECT_EQ(m->sides, kAgent) << m->name;
    }
    if (m->name.starts_with("tlsprof_collector_")) {
      EXPECT_EQ(m->sides, kCollector) << m->name;
    }
  }
}

TEST(SeriesLabels, AreSortedByNameAndLeaveOutUnsetContainerLabels) {
  const auto plain = SeriesLabels(kCpuSeconds, {"cipher", "AES-GCM", "record", "openssl-3", "nginx", "", ""});
  const std::vector<LabelView> expected = {{"algorithm", "AES-GCM"},
                                           {"bucket", "cipher"},
                                           {"library", "openssl-3"},
                                           {"phase", "record"},
                                           {"service", "nginx"}};
  EXPECT_EQ(plain, expected);
  const auto pod = SeriesLabels(kBusyCpuSeconds, {"app", "0123456789ab", "uid"});
  EXPECT_EQ(pod, (std::vector<LabelView>{{"container_id", "0123456789ab"}, {"pod_uid", "uid"}, {"service", "app"}}));
  // Other labels are written when empty.
  EXPECT_EQ(SeriesLabels(kHostBusyCpuSeconds, {""}), (std::vector<LabelView>{{"host", ""}}));
}

TEST(SeriesLabels, RefuseAnotherNumberOfValues) {
  EXPECT_THROW(SeriesLabels(kBusyCpuSeconds, {"app"}), std::logic_error);
}

TEST(Prometheus, RegistersTheTablesNameHelpAndType) {
  prometheus::Registry registry;
  Register<kCollectorJournalBytes>(registry).Add({}).Set(3);
  Register<kAgentBatches>(registry).Add(Labels(kAgentBatches, {"sealed"})).Increment();
  EXPECT_EQ(prometheus::TextSerializer().Serialize(registry.Collect()),
            "# HELP tlsprof_agent_batches_total " + std::string(kAgentBatches.help) +
                "\n# TYPE tlsprof_agent_batches_total counter\ntlsprof_agent_batches_total{result=\"sealed\"} 1\n"
                "# HELP tlsprof_collector_journal_bytes " +
                std::string(kCollectorJournalBytes.help) +
                "\n# TYPE tlsprof_collector_journal_bytes gauge\ntlsprof_collector_journal_bytes 3\n");
  const prometheus::MetricFamily f = Family(kCryptoOperationLatency);
  EXPECT_EQ(f.name, kCryptoOperationLatency.name);
  EXPECT_EQ(f.type, prometheus::MetricType::Histogram);
  EXPECT_TRUE(f.metric.empty());
  const auto labels = ClientLabels(kTlsConnections, {"nginx", "", "", "openssl-3"});
  ASSERT_EQ(labels.size(), 2u);
  EXPECT_EQ(labels[0].name, "library");
  EXPECT_EQ(labels[1].value, "nginx");
}

}  // namespace
}  // namespace tlsprof::metrics
