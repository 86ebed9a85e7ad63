// No privileges: the options tree, its flags and its one validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "agent/commands/options.h"

namespace tlsprof::commands {
namespace {

using ::testing::HasSubstr;

// Parses `args` as the flags of `command`, onto its defaults.
Options Parse(Command command, std::vector<std::string> args) {
  Options options = DefaultOptions(command);
  CLI::App app;
  AddFlags(app, command, options);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  return options;
}

TEST(Options, EachCommandHasItsDefaults) {
  EXPECT_EQ(DefaultOptions(Command::kRun).sampling.frequency_hz, 99u);
  EXPECT_EQ(DefaultOptions(Command::kRun).sampling.memory_limit_bytes, kDefaultRunMemoryLimitBytes);
  EXPECT_EQ(DefaultOptions(Command::kProfile).sampling.frequency_hz, 999u);
  EXPECT_EQ(DefaultOptions(Command::kProfile).sampling.memory_limit_bytes, 0u);
}

TEST(Options, FlagsLandInTheTreeTheProfilerReads) {
  Options o = Parse(Command::kProfile, {"--frequency", "49", "--pid", "7", "--no-stacks", "--usage", "--usage-budget",
                                        "2", "--duration", "3", "--format", "json"});
  EXPECT_EQ(o.report.duration_seconds, 3);
  EXPECT_EQ(o.report.format, "json");
  const profiler::Options po = ProfilerOptions(o, Command::kProfile);
  EXPECT_EQ(po.sampling.frequency_hz, 49u);
  EXPECT_EQ(po.sampling.pids, std::vector<pid_t>{7});
  EXPECT_FALSE(po.sampling.stacks);
  EXPECT_TRUE(po.sampling.usage);
  EXPECT_DOUBLE_EQ(po.sampling.usage_budget_share, 0.02);
  EXPECT_TRUE(po.refresh_all_sampled);  // one window: every sampled process is read again
  EXPECT_FALSE(ProfilerOptions(o, Command::kRun).refresh_all_sampled);
  EXPECT_TRUE(po.keep_stacks);  // the folded and pprof exports list stacks
  EXPECT_FALSE(ProfilerOptions(o, Command::kRun).keep_stacks);
}

TEST(Options, RunTakesSizesWithUnits) {
  Options o = Parse(Command::kRun, {"--memory-limit", "256MiB", "--interval", "5", "--no-container-labels"});
  EXPECT_EQ(o.sampling.memory_limit_bytes, 256ull << 20);
  EXPECT_EQ(o.run.interval_seconds, 5);
  EXPECT_FALSE(o.run.container_labels);
}

// Several collectors: --collector repeated, each occurrence one address (a
// following word is not taken as a second one), and the config file's array.
TEST(Options, CollectorRepeats) {
  Options o = Parse(Command::kRun, {"--collector", "c0:4317", "--collector", "c1:4317", "--insecure"});
  EXPECT_EQ(o.run.ship.collectors, (std::vector<std::string>{"c0:4317", "c1:4317"}));
  EXPECT_THROW(Parse(Command::kRun, {"--collector", "c0:4317", "c1:4317"}), CLI::ParseError);

  Options from_file = DefaultOptions(Command::kRun);
  CLI::App app;
  AddFlags(app, Command::kRun, from_file);
  std::istringstream config("collector = [\"c0:4317\", \"c1:4317\", \"c2:4317\"]\ninsecure = true\n");
  app.set_config("--config");
  for (const auto& item : app.get_config_formatter()->from_config(config)) {
    app.get_option("--" + item.name)->add_result(item.inputs);
  }
  app.parse(std::vector<std::string>{});
  EXPECT_EQ(from_file.run.ship.collectors, (std::vector<std::string>{"c0:4317", "c1:4317", "c2:4317"}));
  Options bad = DefaultOptions(Command::kRun);
  bad.run.ship.insecure = true;
  bad.run.ship.collectors = {"c0:4317", "c1"};
  EXPECT_THAT(Validate(bad, Command::kRun).error().message, HasSubstr("--collector c1: expected HOST:PORT"));
}

TEST(Options, ReportFlagsAreNotRunFlags) {
  EXPECT_THROW(Parse(Command::kRun, {"--duration", "3"}), CLI::ParseError);
  EXPECT_THROW(Parse(Command::kProfile, {"--collector", "c:1"}), CLI::ParseError);
  EXPECT_THROW(Parse(Command::kDemo, {"--pid", "1"}), CLI::ParseError);
}

TEST(Validate, RunFlags) {
  Options o = DefaultOptions(Command::kRun);
  EXPECT_TRUE(Validate(o, Command::kRun).ok());
  o.run.interval_seconds = 0;
  EXPECT_THAT(Validate(o, Command::kRun).error().message, HasSubstr("--interval"));
  o = DefaultOptions(Command::kRun);
  o.run.ship.collectors = {"collector:4317"};
  EXPECT_THAT(Validate(o, Command::kRun).error().message, HasSubstr("--insecure"));
  o.run.ship.insecure = true;
  EXPECT_TRUE(Validate(o, Command::kRun).ok());
  o.run.ship.insecure = false;
  o.run.ship.tls.ca = "ca.pem";
  o.run.ship.tls.cert = "agent.pem";
  EXPECT_THAT(Validate(o, Command::kRun).error().message, HasSubstr("--tls-key"));
  o.run.ship.tls.key = "agent.key";
  EXPECT_TRUE(Validate(o, Command::kRun).ok());
  o.run.ship.insecure = true;
  EXPECT_FALSE(Validate(o, Command::kRun).ok());
  o = DefaultOptions(Command::kRun);
  o.run.metrics_listen = "nonsense";
  EXPECT_THAT(Validate(o, Command::kRun).error().message, HasSubstr("--metrics-listen"));
}

TEST(Validate, ProfileDuration) {
  Options o = DefaultOptions(Command::kProfile);
  EXPECT_TRUE(Validate(o, Command::kProfile).ok());
  o.report.duration_seconds = 0;
  EXPECT_THAT(Validate(o, Command::kProfile).error().message, HasSubstr("--duration"));
}

}  // namespace
}  // namespace tlsprof::commands
