// tlsprof-metric-table: prints the metric table (metric_table.h) as JSON, for
// the tests that check docs/fleet.md and the dashboards against it:
//   {"metrics": [{"name", "type", "labels": [...], "only_when_set": [...],
//                 "help", "sides": ["agent", "collector"]}, ...]}
// in the table's order; "sides" is empty for a reserved metric.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/metrics/metric_table.h"

int main() {
  using namespace tlsprof::metrics;
  nlohmann::json metrics = nlohmann::json::array();
  for (const Metric* m : kAll) {
    nlohmann::json labels = nlohmann::json::array(), only_when_set = nlohmann::json::array();
    for (std::string_view label : m->labels) {
      labels.push_back(label);
      if (OnlyWhenSet(label)) only_when_set.push_back(label);
    }
    nlohmann::json sides = nlohmann::json::array();
    if (m->sides & kAgent) sides.push_back("agent");
    if (m->sides & kCollector) sides.push_back("collector");
    metrics.push_back({{"name", m->name},
                       {"type", TypeName(m->type)},
                       {"labels", std::move(labels)},
                       {"only_when_set", std::move(only_when_set)},
                       {"help", m->help},
                       {"sides", std::move(sides)}});
  }
  std::printf("%s\n", nlohmann::json{{"metrics", std::move(metrics)}}.dump(1).c_str());
  return 0;
}
