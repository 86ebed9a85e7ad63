#include "agent/report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

namespace tlsprof::report {

using nlohmann::json;

namespace {

double Share(uint64_t part, uint64_t whole) { return whole == 0 ? 0.0 : static_cast<double>(part) / whole; }

// A row under this share of its section's total is folded into "rest": the
// table is for finding where the time goes, and such rows are not it.
constexpr double kFoldShare = 0.005;
// The most rows a section prints before folding the others, whatever their
// share. With the fixed parts (headline, grid, footer) these keep a document
// without usage sections within kTableScreenLines.
constexpr size_t kMaxAlgorithmRows = 18;
constexpr size_t kMaxProcessRows = 3;
constexpr size_t kMaxUsageRows = 5;
static_assert(2 + 1 +                                   // headline, blank
                  1 + classify::kBucketCount + 1 + 1 +  // grid: header, buckets, all; blank
                  1 + kMaxAlgorithmRows + 1 + 1 +       // header, rows, rest; blank
                  1 + kMaxProcessRows + 1 + 1 +         // header, rows, rest; blank
                  2 <=                                  // footer
              kTableScreenLines);

std::string Percent(double share) { return fmt::format("{:.1f}%", share * 100.0); }
std::string Seconds(double seconds) { return fmt::format("{:.3f}", seconds); }
// A grid cell: a dash for no time at all, so that the cells with time stand out.
std::string Cell(uint64_t samples, uint64_t total) { return samples == 0 ? "-" : Percent(Share(samples, total)); }
// What a folded row holds: "rest (3 rows)".
std::string RestLabel(size_t n, std::string_view one, std::string_view many) {
  return fmt::format("rest ({} {})", n, n == 1 ? one : many);
}

// Aligned columns, each as wide as its widest cell and two spaces apart.
// `align` has one 'l' or 'r' per column; lines carry no trailing blanks.
class TextTable {
 public:
  TextTable(std::vector<std::string> header, std::string align) : align_(std::move(align)) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void AppendTo(std::string& out) const {
    std::vector<size_t> width(align_.size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        if (i > 0) line += "  ";
        line += align_[i] == 'r' ? fmt::format("{:>{}}", row[i], width[i]) : fmt::format("{:<{}}", row[i], width[i]);
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out += line + "\n";
    }
  }

 private:
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

// How many of a section's rows, sorted largest first, are printed: those at
// or above kFoldShare of the section's total, at most `max_rows`; every row
// with all_rows.
size_t PrintedRows(const std::vector<double>& shares, size_t max_rows, const TableOptions& options) {
  if (options.all_rows) return shares.size();
  size_t n = 0;
  while (n < shares.size() && n < max_rows && shares[n] >= kFoldShare) ++n;
  return n;
}

// The rows of one of the document's arrays, largest `key` first (ties keep
// the document's order), and how many of them the section prints.
struct Ranked {
  std::vector<const json*> rows;
  size_t printed = 0;
};

Ranked Rank(const json& array, const char* key, size_t max_rows, const TableOptions& options) {
  Ranked ranked;
  double total = 0;
  for (const auto& row : array) {
    ranked.rows.push_back(&row);
    total += row[key].get<double>();
  }
  std::stable_sort(ranked.rows.begin(), ranked.rows.end(),
                   [key](const json* a, const json* b) { return (*a)[key].get<double>() > (*b)[key].get<double>(); });
  std::vector<double> shares(ranked.rows.size());
  for (size_t i = 0; i < shares.size(); ++i) shares[i] = total > 0 ? (*ranked.rows[i])[key].get<double>() / total : 0.0;
  ranked.printed = PrintedRows(shares, max_rows, options);
  return ranked;
}

std::vector<std::string> PhaseNames(const json& r) {
  std::vector<std::string> names;
  for (const auto& ph : r["phases"]) names.push_back(ph["phase"].get<std::string>());
  return names;
}

size_t PhaseIndex(const std::vector<std::string>& phases, const std::string& phase) {
  return static_cast<size_t>(std::find(phases.begin(), phases.end(), phase) - phases.begin());
}

void Headline(const json& r, std::string& out) {
  std::string scope = r["scope"]["kind"] == "host"
                          ? fmt::format("host {} ({} CPUs)", r["host"].get<std::string>(), r["cpus"].get<int>())
                          : fmt::format("pids {}", r["scope"]["pids"].dump());
  out += fmt::format("tlsprof: {:.1f} s at {} Hz, {}\n", r["duration_seconds"].get<double>(),
                     r["frequency_hz"].get<uint32_t>(), scope);
  out += fmt::format("TLS = {} of CPU   ({:.3f} of {:.3f} busy CPU-seconds)\n", Percent(r["tls_share"].get<double>()),
                     r["tls_cpu_seconds"].get<double>(), r["cpu_seconds"].get<double>());
}

// Buckets (rows) by phase (columns), in % of TLS time; the "all" row is the
// phases. A cell adds up the algorithm rows of its bucket and phase: they
// split every bucket's samples by phase.
void BucketPhaseGrid(const json& r, std::string& out) {
  const uint64_t tls = r["samples"]["tls"].get<uint64_t>();
  const std::vector<std::string> phases = PhaseNames(r);
  std::map<std::string, std::vector<uint64_t>> cells;  // bucket → samples per phase
  for (const auto& a : r["algorithms"]) {
    std::vector<uint64_t>& row = cells[a["bucket"].get<std::string>()];
    row.resize(phases.size());
    const size_t phase = PhaseIndex(phases, a["phase"].get<std::string>());
    if (phase < phases.size()) row[phase] += a["samples"].get<uint64_t>();
  }
  std::vector<std::string> header{"bucket", "cpu_s", "% of TLS"};
  header.insert(header.end(), phases.begin(), phases.end());
  TextTable table(std::move(header), "lrr" + std::string(phases.size(), 'r'));
  for (const auto& b : r["buckets"]) {
    std::vector<uint64_t>& by_phase = cells[b["bucket"].get<std::string>()];
    by_phase.resize(phases.size());
    std::vector<std::string> row{b["bucket"].get<std::string>(), Seconds(b["cpu_seconds"].get<double>()),
                                 Percent(b["share_of_tls"].get<double>())};
    for (uint64_t n : by_phase) row.push_back(Cell(n, tls));
    table.Add(std::move(row));
  }
  std::vector<std::string> all{"all", Seconds(r["tls_cpu_seconds"].get<double>()), Cell(tls, tls)};
  for (const auto& ph : r["phases"]) all.push_back(Cell(ph["samples"].get<uint64_t>(), tls));
  table.Add(std::move(all));
  table.AppendTo(out);
}

// One row per algorithm of a bucket, its time split by phase as in the grid,
// most time first.
void Algorithms(const json& r, const TableOptions& options, std::string& out) {
  const uint64_t tls = r["samples"]["tls"].get<uint64_t>();
  const std::vector<std::string> phases = PhaseNames(r);
  struct Row {
    std::string algorithm, bucket;
    double cpu_seconds = 0;
    uint64_t samples = 0;
    std::vector<uint64_t> by_phase;
  };
  std::vector<Row> rows;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const auto& a : r["algorithms"]) {
    auto key = std::make_pair(a["bucket"].get<std::string>(), a["algorithm"].get<std::string>());
    auto [it, fresh] = index.try_emplace(key, rows.size());
    if (fresh) rows.push_back({key.second, key.first, 0, 0, std::vector<uint64_t>(phases.size())});
    Row& row = rows[it->second];
    row.cpu_seconds += a["cpu_seconds"].get<double>();
    row.samples += a["samples"].get<uint64_t>();
    const size_t phase = PhaseIndex(phases, a["phase"].get<std::string>());
    if (phase < phases.size()) row.by_phase[phase] += a["samples"].get<uint64_t>();
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.samples > b.samples; });
  std::vector<double> shares(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) shares[i] = Share(rows[i].samples, tls);
  const size_t printed = PrintedRows(shares, kMaxAlgorithmRows, options);

  Row rest{RestLabel(rows.size() - printed, "row", "rows"), "", 0, 0, std::vector<uint64_t>(phases.size())};
  for (size_t i = printed; i < rows.size(); ++i) {
    rest.cpu_seconds += rows[i].cpu_seconds;
    rest.samples += rows[i].samples;
    for (size_t p = 0; p < phases.size(); ++p) rest.by_phase[p] += rows[i].by_phase[p];
  }
  rows.resize(printed);
  if (printed < shares.size()) rows.push_back(std::move(rest));

  std::vector<std::string> header{"algorithm", "bucket", "cpu_s", "% of TLS"};
  header.insert(header.end(), phases.begin(), phases.end());
  TextTable table(std::move(header), "llrr" + std::string(phases.size(), 'r'));
  for (const Row& row : rows) {
    std::vector<std::string> cells{row.algorithm, row.bucket, Seconds(row.cpu_seconds),
                                   Percent(Share(row.samples, tls))};
    for (uint64_t n : row.by_phase) cells.push_back(Cell(n, tls));
    table.Add(std::move(cells));
  }
  table.AppendTo(out);
}

// A process's TLS libraries. A file goes by its name alone unless every row
// is asked for: the names tell the libraries apart, the paths are in the JSON.
std::string Libraries(const json& p, bool full_paths) {
  std::string libs;
  for (const auto& l : p["libraries"]) {
    std::string path = l["path"].get<std::string>();
    if (!full_paths) path = std::filesystem::path(path).filename().string();
    if (!libs.empty()) libs += ", ";
    libs += fmt::format("{} {} ({}, {})", l["kind"].get<std::string>(), l["linkage"].get<std::string>(), path,
                        l["symbols"].get<std::string>());
  }
  return libs;
}

// The processes with TLS time or a TLS library, folded by their share of
// the host's TLS time.
void Processes(const json& r, const TableOptions& options, std::string& out) {
  const Ranked ranked = Rank(r["processes"], "tls_cpu_seconds", kMaxProcessRows, options);
  TextTable table({"comm", "pid", "cpu_s", "tls_s", "tls%", "tls libraries"}, "lrrrrl");
  for (size_t i = 0; i < ranked.printed; ++i) {
    const json& p = *ranked.rows[i];
    table.Add({p["comm"].get<std::string>(), std::to_string(p["pid"].get<int>()),
               Seconds(p["cpu_seconds"].get<double>()), Seconds(p["tls_cpu_seconds"].get<double>()),
               Percent(p["tls_share"].get<double>()), Libraries(p, options.all_rows)});
  }
  if (ranked.printed < ranked.rows.size()) {
    double cpu = 0, tls = 0;
    for (size_t i = ranked.printed; i < ranked.rows.size(); ++i) {
      cpu += (*ranked.rows[i])["cpu_seconds"].get<double>();
      tls += (*ranked.rows[i])["tls_cpu_seconds"].get<double>();
    }
    table.Add({RestLabel(ranked.rows.size() - ranked.printed, "process", "processes"), "", Seconds(cpu), Seconds(tls),
               "", ""});
  }
  table.AppendTo(out);
}

void Footer(const json& r, std::string& out) {
  const auto& a = r["agent"];
  out += fmt::format(
      "agent: {} of a core in the window ({:.3f} CPU-s + {:.3f} s BPF), {:.3f} CPU-s in all, max RSS {:.1f} MB\n",
      Percent(a["cpu_share_of_core"].get<double>()), a["window_cpu_seconds"].get<double>(),
      a["bpf_seconds"].get<double>(), a["cpu_seconds"].get<double>(), a["max_rss_bytes"].get<double>() / 1e6);
  const auto& s = r["samples"];
  out += fmt::format("samples: {} total, {} busy, {} TLS, {} idle, {} dropped, {} unresolved; report after {:.0f} ms\n",
                     s["total"].get<uint64_t>(), s["busy"].get<uint64_t>(), s["tls"].get<uint64_t>(),
                     s["idle"].get<uint64_t>(), s["dropped"].get<uint64_t>(), s["unresolved"].get<uint64_t>(),
                     a["report_latency_seconds"].get<double>() * 1000);
}

// Handshakes by negotiated parameters, the most frequent first, folded by
// their share of all handshakes.
void Handshakes(const json& r, const TableOptions& options, std::string& out) {
  const Ranked ranked = Rank(r["handshakes"], "count", kMaxUsageRows, options);
  uint64_t total = 0;
  for (const json* h : ranked.rows) total += (*h)["count"].get<uint64_t>();
  TextTable table({"comm", "pid", "side", "kind", "version", "cipher_suite", "group", "cert", "count", "share"},
                  "lrllllllrr");
  for (size_t i = 0; i < ranked.printed; ++i) {
    const json& h = *ranked.rows[i];
    table.Add({h["comm"].get<std::string>(), std::to_string(h["pid"].get<uint32_t>()), h["side"].get<std::string>(),
               h["kind"].get<std::string>(), h["version"].get<std::string>(), h["cipher_suite"].get<std::string>(),
               h["group"].get<std::string>(), h["cert_key_type"].get<std::string>(),
               std::to_string(h["count"].get<uint64_t>()), Percent(Share(h["count"].get<uint64_t>(), total))});
  }
  if (ranked.printed < ranked.rows.size()) {
    uint64_t count = 0;
    for (size_t i = ranked.printed; i < ranked.rows.size(); ++i) count += (*ranked.rows[i])["count"].get<uint64_t>();
    table.Add({RestLabel(ranked.rows.size() - ranked.printed, "row", "rows"), "", "", "", "", "", "", "",
               std::to_string(count), Percent(Share(count, total))});
  }
  table.AppendTo(out);
}

// Public-key operations, the most frequent first. Quantiles do not add up,
// so the rest row has a count only.
void Operations(const json& r, const TableOptions& options, std::string& out) {
  const Ranked ranked = Rank(r["operations"], "count", kMaxUsageRows, options);
  TextTable table({"comm", "pid", "operation", "algorithm", "count", "p50_us", "p99_us"}, "lrllrrr");
  for (size_t i = 0; i < ranked.printed; ++i) {
    const json& o = *ranked.rows[i];
    table.Add({o["comm"].get<std::string>(), std::to_string(o["pid"].get<uint32_t>()),
               o["operation"].get<std::string>(), o["algorithm"].get<std::string>(),
               std::to_string(o["count"].get<uint64_t>()), fmt::format("{:.1f}", o["latency_p50_us"].get<double>()),
               fmt::format("{:.1f}", o["latency_p99_us"].get<double>())});
  }
  if (ranked.printed < ranked.rows.size()) {
    uint64_t count = 0;
    for (size_t i = ranked.printed; i < ranked.rows.size(); ++i) count += (*ranked.rows[i])["count"].get<uint64_t>();
    table.Add(
        {RestLabel(ranked.rows.size() - ranked.printed, "row", "rows"), "", "", "", std::to_string(count), "", ""});
  }
  table.AppendTo(out);
}

// TLS CPU of the handshake phase per handshake, per process, the processes
// with the most handshakes first.
void HandshakeCpu(const json& r, const TableOptions& options, std::string& out) {
  const Ranked ranked = Rank(r["handshake_cpu"], "handshakes", kMaxUsageRows, options);
  TextTable table({"comm", "pid", "handshakes", "hs_cpu_s", "us_per_hs"}, "lrrrr");
  for (size_t i = 0; i < ranked.printed; ++i) {
    const json& c = *ranked.rows[i];
    table.Add({c["comm"].get<std::string>(), std::to_string(c["pid"].get<uint32_t>()),
               std::to_string(c["handshakes"].get<uint64_t>()), Seconds(c["handshake_tls_cpu_seconds"].get<double>()),
               fmt::format("{:.1f}", c["cpu_seconds_per_handshake"].get<double>() * 1e6)});
  }
  if (ranked.printed < ranked.rows.size()) {
    uint64_t handshakes = 0;
    double cpu = 0, estimated = 0;
    for (size_t i = ranked.printed; i < ranked.rows.size(); ++i) {
      const json& c = *ranked.rows[i];
      handshakes += c["handshakes"].get<uint64_t>();
      cpu += c["handshake_tls_cpu_seconds"].get<double>();
      estimated += c["estimated_handshakes"].get<double>();
    }
    // The same quotient as a process's (docs/usage.md, "Cost per handshake").
    table.Add({RestLabel(ranked.rows.size() - ranked.printed, "process", "processes"), "", std::to_string(handshakes),
               Seconds(cpu), fmt::format("{:.1f}", estimated > 0 ? cpu / estimated * 1e6 : 0.0)});
  }
  table.AppendTo(out);
}

}  // namespace

std::string RenderTable(const json& r, const TableOptions& options) {
  std::string out;
  Headline(r, out);
  out += "\n";
  BucketPhaseGrid(r, out);
  out += "\n";
  Algorithms(r, options, out);
  out += "\n";
  Processes(r, options, out);
  // Usage telemetry (tlsprof-agent profile --usage).
  if (r.contains("handshakes")) {
    out += "\n";
    Handshakes(r, options, out);
    out += "\n";
    Operations(r, options, out);
    out += "\n";
    HandshakeCpu(r, options, out);
  }
  out += "\n";
  Footer(r, out);
  return out;
}

}  // namespace tlsprof::report
