// The table rendered from fixed report documents: a small one whose figures
// are easy to check by hand, and the demo's report (testdata/), cut to the
// fields the table reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "agent/report/report.h"

namespace tlsprof::report {
namespace {

using nlohmann::json;

// 1000 TLS samples of 1 ms each: a sample is 0.1% of TLS time. The algorithm
// rows split each bucket by phase; three rows (AES-CBC, SHA-1, library) are
// under 0.5% of TLS, and so are two processes and two handshake rows.
constexpr const char* kSmallReport = R"({
  "schema": "tlsprof.report.v1", "host": "web-1", "cpus": 4, "duration_seconds": 10.0, "frequency_hz": 99,
  "scope": {"kind": "host", "pids": []},
  "cpu_seconds": 4.0, "tls_cpu_seconds": 1.0, "tls_share": 0.25,
  "buckets": [
    {"bucket": "cipher", "cpu_seconds": 0.4, "samples": 400, "share_of_tls": 0.4},
    {"bucket": "signature", "cpu_seconds": 0.25, "samples": 250, "share_of_tls": 0.25},
    {"bucket": "key_exchange", "cpu_seconds": 0.15, "samples": 150, "share_of_tls": 0.15},
    {"bucket": "hash", "cpu_seconds": 0.1, "samples": 100, "share_of_tls": 0.1},
    {"bucket": "other", "cpu_seconds": 0.1, "samples": 100, "share_of_tls": 0.1}],
  "phases": [
    {"phase": "handshake", "cpu_seconds": 0.5, "samples": 500, "share_of_tls": 0.5},
    {"phase": "record", "cpu_seconds": 0.45, "samples": 450, "share_of_tls": 0.45},
    {"phase": "other", "cpu_seconds": 0.05, "samples": 50, "share_of_tls": 0.05}],
  "algorithms": [
    {"bucket": "cipher", "algorithm": "AES-GCM", "phase": "record", "cpu_seconds": 0.3, "samples": 300,
     "share_of_tls": 0.3},
    {"bucket": "signature", "algorithm": "RSA", "phase": "handshake", "cpu_seconds": 0.24, "samples": 240,
     "share_of_tls": 0.24},
    {"bucket": "key_exchange", "algorithm": "X25519", "phase": "handshake", "cpu_seconds": 0.15, "samples": 150,
     "share_of_tls": 0.15},
    {"bucket": "cipher", "algorithm": "ChaCha20-Poly1305", "phase": "record", "cpu_seconds": 0.077, "samples": 77,
     "share_of_tls": 0.077},
    {"bucket": "hash", "algorithm": "SHA-256", "phase": "handshake", "cpu_seconds": 0.06, "samples": 60,
     "share_of_tls": 0.06},
    {"bucket": "hash", "algorithm": "SHA-256", "phase": "record", "cpu_seconds": 0.036, "samples": 36,
     "share_of_tls": 0.036},
    {"bucket": "other", "algorithm": "unknown", "phase": "other", "cpu_seconds": 0.035, "samples": 35,
     "share_of_tls": 0.035},
    {"bucket": "other", "algorithm": "record", "phase": "record", "cpu_seconds": 0.033, "samples": 33,
     "share_of_tls": 0.033},
    {"bucket": "other", "algorithm": "x509", "phase": "handshake", "cpu_seconds": 0.03, "samples": 30,
     "share_of_tls": 0.03},
    {"bucket": "cipher", "algorithm": "AES-GCM", "phase": "handshake", "cpu_seconds": 0.02, "samples": 20,
     "share_of_tls": 0.02},
    {"bucket": "signature", "algorithm": "RSA", "phase": "other", "cpu_seconds": 0.01, "samples": 10,
     "share_of_tls": 0.01},
    {"bucket": "hash", "algorithm": "SHA-1", "phase": "record", "cpu_seconds": 0.004, "samples": 4,
     "share_of_tls": 0.004},
    {"bucket": "cipher", "algorithm": "AES-CBC", "phase": "other", "cpu_seconds": 0.003, "samples": 3,
     "share_of_tls": 0.003},
    {"bucket": "other", "algorithm": "library", "phase": "other", "cpu_seconds": 0.002, "samples": 2,
     "share_of_tls": 0.002}],
  "processes": [
    {"pid": 101, "comm": "nginx", "cpu_seconds": 2.0, "tls_cpu_seconds": 0.7, "tls_share": 0.35,
     "libraries": [{"path": "/usr/lib/x86_64-linux-gnu/libssl.so.3", "kind": "openssl-3", "linkage": "shared",
                    "symbols": "symtab"}]},
    {"pid": 102, "comm": "haproxy", "cpu_seconds": 1.0, "tls_cpu_seconds": 0.25, "tls_share": 0.25,
     "libraries": []},
    {"pid": 103, "comm": "curl", "cpu_seconds": 0.5, "tls_cpu_seconds": 0.046, "tls_share": 0.092,
     "libraries": []},
    {"pid": 104, "comm": "sshd", "cpu_seconds": 0.3, "tls_cpu_seconds": 0.004, "tls_share": 0.013,
     "libraries": []},
    {"pid": 105, "comm": "tlsprof-agent", "cpu_seconds": 0.2, "tls_cpu_seconds": 0.0, "tls_share": 0.0,
     "libraries": []}],
  "samples": {"total": 4000, "busy": 4000, "tls": 1000, "idle": 0, "dropped": 0, "unresolved": 3},
  "agent": {"cpu_seconds": 0.5, "window_cpu_seconds": 0.05, "bpf_seconds": 0.01, "cpu_share_of_core": 0.006,
            "max_rss_bytes": 50000000, "report_latency_seconds": 0.2},
  "handshakes": [
    {"pid": 101, "comm": "nginx", "side": "server", "kind": "full", "version": "TLSv1.3",
     "cipher_suite": "TLS_AES_128_GCM_SHA256", "group": "X25519", "cert_key_type": "RSA", "count": 600},
    {"pid": 101, "comm": "nginx", "side": "server", "kind": "resumed", "version": "TLSv1.2",
     "cipher_suite": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "group": "none", "cert_key_type": "RSA", "count": 4},
    {"pid": 101, "comm": "nginx", "side": "server", "kind": "resumed", "version": "TLSv1.3",
     "cipher_suite": "TLS_AES_128_GCM_SHA256", "group": "X25519", "cert_key_type": "RSA", "count": 300},
    {"pid": 102, "comm": "haproxy", "side": "server", "kind": "full", "version": "TLSv1.3",
     "cipher_suite": "TLS_AES_256_GCM_SHA384", "group": "P-256", "cert_key_type": "ECDSA", "count": 95},
    {"pid": 103, "comm": "curl", "side": "client", "kind": "full", "version": "TLSv1.3",
     "cipher_suite": "TLS_AES_256_GCM_SHA384", "group": "P-256", "cert_key_type": "ECDSA", "count": 1}],
  "operations": [
    {"pid": 101, "comm": "nginx", "operation": "sign", "algorithm": "RSA-2048", "count": 600,
     "latency_p50_us": 600.0, "latency_p99_us": 900.0},
    {"pid": 101, "comm": "nginx", "operation": "key_exchange", "algorithm": "X25519", "count": 900,
     "latency_p50_us": 35.0, "latency_p99_us": 50.0}],
  "handshake_cpu": [
    {"pid": 101, "comm": "nginx", "handshakes": 904, "estimated_handshakes": 904.0,
     "handshake_tls_cpu_seconds": 0.45, "cpu_seconds_per_handshake": 0.000497787},
    {"pid": 102, "comm": "haproxy", "handshakes": 95, "estimated_handshakes": 95.0,
     "handshake_tls_cpu_seconds": 0.04, "cpu_seconds_per_handshake": 0.000421053},
    {"pid": 103, "comm": "curl", "handshakes": 1, "estimated_handshakes": 1.0,
     "handshake_tls_cpu_seconds": 0.0, "cpu_seconds_per_handshake": 0.0}]
})";

json SmallReport() { return json::parse(kSmallReport); }

json DemoReport() {
  std::ifstream in(std::string(TLSPROF_SOURCE_DIR) + "/agent/report/testdata/demo_report.json");
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The block of lines (up to a blank one) whose header's first words are
// those of `header`.
std::vector<std::string> Section(const std::string& table, const std::string& header) {
  const std::vector<std::string> want = Words(header);
  std::vector<std::string> section;
  for (const std::string& line : Lines(table)) {
    const std::vector<std::string> words = Words(line);
    if (section.empty() && (words.size() < want.size() || !std::equal(want.begin(), want.end(), words.begin()))) {
      continue;
    }
    if (line.empty()) break;
    section.push_back(line);
  }
  return section;
}

// The cells after `label` on the section's line that starts with it; empty
// if there is none.
std::vector<std::string> Cells(const std::vector<std::string>& section, const std::string& label) {
  for (const std::string& line : section) {
    if (line.rfind(label + "  ", 0) == 0) return Words(line.substr(label.size()));
  }
  return {};
}

using Strings = std::vector<std::string>;

TEST(RenderTable, HeadlineSaysTheTlsShareTheWindowAndTheScope) {
  const Strings lines = Lines(RenderTable(SmallReport()));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "tlsprof: 10.0 s at 99 Hz, host web-1 (4 CPUs)");
  EXPECT_EQ(lines[1], "TLS = 25.0% of CPU   (1.000 of 4.000 busy CPU-seconds)");
}

TEST(RenderTable, GridCellsAddTheAlgorithmRowsOfTheirBucketAndPhase) {
  const Strings grid = Section(RenderTable(SmallReport()), "bucket");
  ASSERT_FALSE(grid.empty());
  EXPECT_EQ(Words(grid[0]), (Strings{"bucket", "cpu_s", "%", "of", "TLS", "handshake", "record", "other"}));
  EXPECT_EQ(Cells(grid, "cipher"), (Strings{"0.400", "40.0%", "2.0%", "37.7%", "0.3%"}));
  EXPECT_EQ(Cells(grid, "signature"), (Strings{"0.250", "25.0%", "24.0%", "-", "1.0%"}));
  EXPECT_EQ(Cells(grid, "key_exchange"), (Strings{"0.150", "15.0%", "15.0%", "-", "-"}));
  EXPECT_EQ(Cells(grid, "hash"), (Strings{"0.100", "10.0%", "6.0%", "4.0%", "-"}));
  EXPECT_EQ(Cells(grid, "other"), (Strings{"0.100", "10.0%", "3.0%", "3.3%", "3.7%"}));
  // The last row is the phases.
  EXPECT_EQ(Cells(grid, "all"), (Strings{"1.000", "100.0%", "50.0%", "45.0%", "5.0%"}));
  EXPECT_EQ(grid.size(), 7u);
}

TEST(RenderTable, AnAlgorithmIsOneRowWithItsTimeSplitByPhase) {
  const Strings algorithms = Section(RenderTable(SmallReport()), "algorithm");
  ASSERT_FALSE(algorithms.empty());
  EXPECT_EQ(Cells(algorithms, "AES-GCM"), (Strings{"cipher", "0.320", "32.0%", "2.0%", "30.0%", "-"}));
  EXPECT_EQ(Cells(algorithms, "RSA"), (Strings{"signature", "0.250", "25.0%", "24.0%", "-", "1.0%"}));
  // Most time first.
  EXPECT_EQ(Words(algorithms[1])[0], "AES-GCM");
  EXPECT_EQ(Words(algorithms[2])[0], "RSA");
}

TEST(RenderTable, RowsUnderHalfAPercentOfTlsFoldIntoOneRestRowThatAddsThemUp) {
  const Strings algorithms = Section(RenderTable(SmallReport()), "algorithm");
  for (const char* folded : {"AES-CBC", "SHA-1", "library"}) {
    EXPECT_TRUE(Cells(algorithms, folded).empty()) << folded;
  }
  // SHA-1 (record, 4), AES-CBC (other, 3), library (other, 2).
  EXPECT_EQ(Cells(algorithms, "rest (3 rows)"), (Strings{"0.009", "0.9%", "-", "0.4%", "0.5%"}));
  EXPECT_EQ(algorithms.back().rfind("rest (3 rows)", 0), 0u);
  // Header, eight rows at or above 0.5%, rest.
  EXPECT_EQ(algorithms.size(), 10u);
}

TEST(RenderTable, SmallProcessesFoldTooAndLibrariesGoByFileName) {
  const Strings processes = Section(RenderTable(SmallReport()), "comm pid cpu_s");
  ASSERT_FALSE(processes.empty());
  EXPECT_EQ(Cells(processes, "nginx"),
            (Strings{"101", "2.000", "0.700", "35.0%", "openssl-3", "shared", "(libssl.so.3,", "symtab)"}));
  EXPECT_FALSE(Cells(processes, "curl").empty());
  EXPECT_TRUE(Cells(processes, "sshd").empty());
  EXPECT_EQ(Cells(processes, "rest (2 processes)"), (Strings{"0.500", "0.004"}));
}

TEST(RenderTable, UsageSectionsFoldTheSameWay) {
  const std::string table = RenderTable(SmallReport());
  const Strings handshakes = Section(table, "comm pid side");
  ASSERT_EQ(handshakes.size(), 5u) << table;  // header, three rows, rest
  EXPECT_EQ(Words(handshakes[1]).back(), "60.0%");
  EXPECT_EQ(Cells(handshakes, "rest (2 rows)"), (Strings{"5", "0.5%"}));
  const Strings operations = Section(table, "comm pid operation");
  ASSERT_EQ(operations.size(), 3u) << table;
  EXPECT_EQ(Words(operations[1])[3], "X25519");  // the most frequent first
  const Strings cpu = Section(table, "comm pid handshakes");
  ASSERT_EQ(cpu.size(), 4u) << table;
  EXPECT_EQ(Cells(cpu, "rest (1 process)"), (Strings{"1", "0.000", "0.0"}));
}

TEST(RenderTable, AllPrintsEveryRowAndFoldsNothing) {
  const json report = SmallReport();
  const std::string table = RenderTable(report, {.all_rows = true});
  EXPECT_EQ(table.find("rest ("), std::string::npos) << table;
  const Strings algorithms = Section(table, "algorithm");
  for (const auto& a : report["algorithms"]) {
    EXPECT_FALSE(Cells(algorithms, a["algorithm"].get<std::string>()).empty()) << a;
  }
  EXPECT_EQ(algorithms.size(), 1u + 11u);  // header, one row per bucket and algorithm
  const Strings processes = Section(table, "comm pid cpu_s");
  EXPECT_EQ(processes.size(), 1u + report["processes"].size());
  // Every row shows the whole path of its libraries.
  EXPECT_NE(table.find("(/usr/lib/x86_64-linux-gnu/libssl.so.3, symtab)"), std::string::npos);
  EXPECT_EQ(Section(table, "comm pid side").size(), 1u + report["handshakes"].size());
  EXPECT_EQ(Section(table, "comm pid handshakes").size(), 1u + report["handshake_cpu"].size());
}

TEST(RenderTable, TheDemoReportFitsOnOneScreen) {
  json report = DemoReport();
  for (const char* usage : {"handshakes", "operations", "handshake_cpu"}) report.erase(usage);
  const std::string table = RenderTable(report);
  EXPECT_LE(Lines(table).size(), kTableScreenLines) << table;
  // And --all prints each of its algorithm rows.
  EXPECT_GT(Lines(RenderTable(report, {.all_rows = true})).size(), kTableScreenLines);
}

TEST(RenderTable, ANonBlankLineHasNoTrailingBlanks) {
  for (bool all_rows : {false, true}) {
    for (const std::string& line : Lines(RenderTable(DemoReport(), {.all_rows = all_rows}))) {
      EXPECT_TRUE(line.empty() || line.back() != ' ') << "'" << line << "'";
    }
  }
}

TEST(RenderTable, AnyReportWithoutUsageFitsOnOneScreen) {
  // Far more rows at or above 0.5% than a screen holds: the sections cap them.
  json report = SmallReport();
  for (const char* usage : {"handshakes", "operations", "handshake_cpu"}) report.erase(usage);
  report["algorithms"] = json::array();
  report["processes"] = json::array();
  for (int i = 0; i < 50; ++i) {
    report["algorithms"].push_back({{"bucket", "cipher"},
                                    {"algorithm", "alg-" + std::to_string(i)},
                                    {"phase", "record"},
                                    {"cpu_seconds", 0.02},
                                    {"samples", 20},
                                    {"share_of_tls", 0.02}});
    report["processes"].push_back({{"pid", 1000 + i},
                                   {"comm", "worker"},
                                   {"cpu_seconds", 0.1},
                                   {"tls_cpu_seconds", 0.02},
                                   {"tls_share", 0.2},
                                   {"libraries", json::array()}});
  }
  const std::string table = RenderTable(report);
  EXPECT_LE(Lines(table).size(), kTableScreenLines) << table;
  EXPECT_NE(table.find("rest (32 rows)"), std::string::npos) << table;
  EXPECT_NE(table.find("rest (47 processes)"), std::string::npos) << table;
}

}  // namespace
}  // namespace tlsprof::report
