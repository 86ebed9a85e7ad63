// A recorded window (window.json, from `tlsprof-agent demo --usage
// --record-window`) replayed through every sink: the JSON report, the table,
// the folded and pprof exports, the fleet report and the agent's /metrics
// must equal the files beside it byte for byte. A change to a sink's output
// shows here as a diff to review; TLSPROF_UPDATE_GOLDEN=1 rewrites the files
// (then read the diff before committing it).
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/expose/metrics_sink.h"
#include "agent/profiler/window_record.h"
#include "agent/report/exports.h"
#include "agent/report/report.h"
#include "agent/wire/encode.h"

namespace tlsprof {
namespace {

const std::filesystem::path kDir = std::filesystem::path(TLSPROF_SOURCE_DIR) / "tests" / "golden";

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// Compares `actual` with the golden file `name`, or rewrites it.
void ExpectGolden(const std::string& name, const std::string& actual) {
  const std::filesystem::path path = kDir / name;
  if (std::getenv("TLSPROF_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run with TLSPROF_UPDATE_GOLDEN=1";
  const std::string expected = Read(path);
  if (expected == actual) return;
  const std::filesystem::path got = std::filesystem::path(TLSPROF_BINARY_DIR) / "test-output" / ("golden-" + name);
  std::filesystem::create_directories(got.parent_path());
  std::ofstream(got, std::ios::binary) << actual;
  ADD_FAILURE() << name << " differs from the golden file: diff " << path << " " << got;
}

class WindowGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    auto replayed = profiler::ReadWindowRecord(kDir / "window.json");
    ASSERT_TRUE(replayed.ok()) << replayed.error().message;
    window_ = std::move(replayed).value();
  }
  profiler::Window window_;
};

TEST_F(WindowGolden, RecordingRoundTrips) {
  EXPECT_EQ(profiler::RecordWindow(window_), nlohmann::json::parse(Read(kDir / "window.json")));
  ASSERT_TRUE(window_.usage.has_value());
  EXPECT_FALSE(window_.attribution.stacks.empty());
}

TEST_F(WindowGolden, JsonReportAndTable) {
  const nlohmann::json doc = report::BuildReport(window_);
  ExpectGolden("report.json", doc.dump(2) + "\n");
  ExpectGolden("report.txt", report::RenderTable(doc));
}

TEST_F(WindowGolden, FoldedAndPprof) {
  ExpectGolden("stacks.folded", report::FoldedStacks(window_.attribution));
  ExpectGolden("stacks.pprof", report::PprofProfile(window_.attribution, window_.host.period_ns, window_.start_unix_ns,
                                                    window_.duration_seconds()));
}

TEST_F(WindowGolden, FleetReportAndAgentMetrics) {
  const v1::AgentReport report = wire::EncodeWindow(window_, {}, {.batches = 3, .dropped = 1});
  std::string text;
  ASSERT_TRUE(google::protobuf::TextFormat::PrintToString(report, &text));
  ExpectGolden("report.txtpb", text);
  expose::AgentMetrics metrics;
  expose::MetricsSink sink(metrics);
  ASSERT_TRUE(sink.Consume(window_, report).ok());
  ExpectGolden("metrics.txt", metrics.Text());
}

TEST(WindowRecord, NotARecordingIsAClearError) {
  auto bad = profiler::ReplayWindow(nlohmann::json::parse(R"({"schema": "tlsprof.report.v1"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not a window recording"), std::string::npos);
  auto truncated = profiler::ReplayWindow(nlohmann::json::parse(R"({"schema": "tlsprof.window.v1", "profile": 3})"));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message.find("window recording"), std::string::npos);
}

}  // namespace
}  // namespace tlsprof
