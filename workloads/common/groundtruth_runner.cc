// See groundtruth_runner.h. The measurement loop moved here unchanged from
// groundtruth/main.cc so the OpenSSL, BoringSSL and shared-library variants
// schedule and measure identically.

#include "groundtruth_runner.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "workload_util.h"

namespace tlsprof::workload {
namespace {

using Category = GroundTruthCategory;

struct Options {
  double duration = 20;
  double warmup = 1;
  double slice_ms = 20;
  std::string mix;
  std::optional<unsigned long long> seed;  // set when --seed is given
  bool with_p256 = false;
  std::string output;
  std::string ready_file;
};

// Parses "name=weight,..." into the categories' weights; names not listed
// get weight 0 (disabled).
bool ApplyMix(const std::string& mix, std::vector<Category>& cats) {
  for (auto& c : cats) c.weight = 0;
  for (const auto& e : ParseMix(mix)) {
    auto it = std::find_if(cats.begin(), cats.end(), [&](auto& c) { return c.name == e.name; });
    if (it == cats.end()) {
      std::string known;
      for (auto& c : cats) known += " " + c.name;
      std::fprintf(stderr, "--mix: unknown category '%s'; known:%s\n", e.name.c_str(), known.c_str());
      return false;
    }
    if (!(e.weight >= 0)) {
      std::fprintf(stderr, "--mix: weight for '%s' must be a number >= 0\n", e.name.c_str());
      return false;
    }
    it->weight = e.weight;
  }
  return true;
}

// Sizes each category's batch so that one batch takes about 200 us: short
// enough that a slice ends close to slice_ms, long enough that the clock
// reads between batches stay far below 1% of the measured time.
bool Calibrate(GroundTruthSpec& spec) {
  for (auto& c : spec.categories) {
    if (c.weight <= 0) continue;
    for (int i = 0; i < 3; ++i) {
      if (!c.Run(false)) return spec.report_failure("warm-up of " + c.name), false;
    }
    const long long t0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
    int n = 0;
    while (NowNanos(CLOCK_THREAD_CPUTIME_ID) - t0 < 5'000'000) {
      if (!c.Run(false)) return spec.report_failure(c.name), false;
      ++n;
    }
    const double per_op = 5e6 / n;
    c.batch = std::max(1, static_cast<int>(200'000 / per_op));
  }
  return true;
}

struct Window {
  long long start_realtime_ns = 0, end_realtime_ns = 0;
  long long start_mono_ns = 0, end_mono_ns = 0;
  long long thread_cpu_ns = 0;
  long long process_cpu_ns = 0;
  // (CLOCK_MONOTONIC ns, measured category CPU ns so far), about every
  // kTimelineStepNs: a profile of a sub-window is compared with the truth
  // of that same sub-window, whatever the machine's load did meanwhile.
  std::vector<std::pair<long long, long long>> timeline;
};
constexpr long long kTimelineStepNs = 100'000'000;

std::atomic<bool> g_stop{false};
std::atomic<bool> g_measuring{false};
std::atomic<bool> g_failed{false};

// The worker: warm-up, then the measured window until g_stop.
void Worker(GroundTruthSpec& spec, const Options& opt, Window& win, std::atomic<int>& tid_out,
            std::atomic<bool>& warm_done) {
  pthread_setname_np(pthread_self(), "tlsprof-gt-wrk");
  tid_out = static_cast<int>(syscall(SYS_gettid));
  const long long slice_ns = static_cast<long long>(opt.slice_ms * 1e6);
  auto& cats = spec.categories;

  auto run_slice = [&](Category& c) -> long long {
    const long long t0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
    long long t1 = t0;
    long long ops = 0;
    const bool measuring = g_measuring;
    while (t1 - t0 < slice_ns) {
      for (int i = 0; i < c.batch; ++i) {
        if (!c.Run(measuring)) {
          spec.report_failure(c.name);
          g_failed = true;
          g_stop = true;
          break;
        }
      }
      ops += c.batch;
      t1 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
      if (g_stop) break;
    }
    if (measuring) c.ops += ops;
    return t1 - t0;
  };
  // Deficit scheduling: run next the category with the least CPU per unit
  // of weight, so shares converge on the weights whatever an op costs.
  auto pick = [&](bool measuring) -> Category& {
    Category* best = nullptr;
    double best_v = 0;
    for (auto& c : cats) {
      if (c.weight <= 0) continue;
      const double v = static_cast<double>(measuring ? c.cpu_ns : c.warm_cpu_ns) / c.weight;
      if (best == nullptr || v < best_v) best = &c, best_v = v;
    }
    return *best;
  };

  const long long warm_end = NowNanos(CLOCK_MONOTONIC) + static_cast<long long>(opt.warmup * 1e9);
  while (!g_stop && NowNanos(CLOCK_MONOTONIC) < warm_end) {
    Category& c = pick(false);
    c.warm_cpu_ns += run_slice(c);
  }

  win.start_mono_ns = NowNanos(CLOCK_MONOTONIC);
  win.start_realtime_ns = NowNanos(CLOCK_REALTIME);
  const long long cpu0 = NowNanos(CLOCK_THREAD_CPUTIME_ID);
  const long long pcpu0 = NowNanos(CLOCK_PROCESS_CPUTIME_ID);
  g_measuring = true;
  warm_done = true;
  long long measured_ns = 0;
  win.timeline.emplace_back(win.start_mono_ns, 0);
  while (!g_stop) {
    Category& c = pick(true);
    const long long used = run_slice(c);
    c.cpu_ns += used;
    measured_ns += used;
    const long long now = NowNanos(CLOCK_MONOTONIC);
    if (now - win.timeline.back().first >= kTimelineStepNs) win.timeline.emplace_back(now, measured_ns);
  }
  win.thread_cpu_ns = NowNanos(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  win.process_cpu_ns = NowNanos(CLOCK_PROCESS_CPUTIME_ID) - pcpu0;
  win.end_mono_ns = NowNanos(CLOCK_MONOTONIC);
  win.end_realtime_ns = NowNanos(CLOCK_REALTIME);
}

// splitmix64 (Steele, Lea, Flood 2014): a seed gives one sequence in every
// language, with no library to agree on.
class SplitMix64 {
 public:
  explicit SplitMix64(unsigned long long seed) : state_(seed) {}
  unsigned long long Next() {
    unsigned long long z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  unsigned long long state_;
};

constexpr const char* kStandardNames[] = {"aes_gcm", "chacha20_poly1305", "aes_cbc",    "sha256",     "sha1",     "rsa",
                                          "x25519",  "ecdsa_p256",        "ecdhe_p256", "ml_kem_768", "ml_dsa_65"};

}  // namespace

std::vector<SeededDraw> DrawSeededMix(unsigned long long seed) {
  SplitMix64 rng(seed);
  std::vector<SeededDraw> draws;
  std::vector<double> kept_weight;
  for (const char* name : kStandardNames) {
    const double weight = 0.25 * std::pow(16.0, rng.Uniform());
    const bool dropped = rng.Uniform() < 0.2;
    const double fresh = rng.Uniform();
    draws.push_back({name, dropped ? 0.0 : weight, fresh});
    kept_weight.push_back(weight);
  }
  auto kept = [&] { return std::count_if(draws.begin(), draws.end(), [](auto& d) { return d.weight > 0; }); };
  for (size_t i = 0; i < draws.size() && kept() < 2; ++i) draws[i].weight = kept_weight[i];
  return draws;
}

std::vector<GroundTruthCategory> StandardCategories(GroundTruthOps ops) {
  constexpr size_t kBulk = kGroundTruthBufferBytes;
  std::vector<GroundTruthCategory> cats = {
      {"aes_gcm", "cipher", "AES-GCM", false, kBulk, std::move(ops.aes_gcm)},
      {"chacha20_poly1305", "cipher", "ChaCha20-Poly1305", false, kBulk, std::move(ops.chacha20_poly1305)},
      {"aes_cbc", "cipher", "AES-CBC", false, kBulk, std::move(ops.aes_cbc)},
      {"sha256", "hash", "SHA-256", false, kBulk, std::move(ops.sha256)},
      {"sha1", "hash", "SHA-1", false, kBulk, std::move(ops.sha1)},
      {"rsa", "signature", "RSA", false, 0, std::move(ops.rsa)},
      {"x25519", "key_exchange", "X25519", false, 0, std::move(ops.x25519)},
      {"ecdsa_p256", "signature", "ECDSA-P256", true, 0, std::move(ops.ecdsa_p256)},
      {"ecdhe_p256", "key_exchange", "ECDHE-P256", true, 0, std::move(ops.ecdhe_p256)},
  };
  // A handshake's ML-KEM: keygen and decapsulate (client), encapsulate (server).
  if (ops.ml_kem_768.reused) {
    cats.push_back({"ml_kem_768", "key_exchange", "ML-KEM", false, 0, std::move(ops.ml_kem_768)});
    cats.back().in_default_mix = false;
  }
  if (ops.ml_dsa_65.reused) {
    cats.push_back({"ml_dsa_65", "signature", "ML-DSA", false, 0, std::move(ops.ml_dsa_65)});
    cats.back().in_default_mix = false;
  }
  return cats;
}

int RunGroundTruth(int argc, char** argv, GroundTruthSpec spec) {
  Options opt;
  std::string names;
  for (const auto& c : spec.categories) names += (names.empty() ? "" : ", ") + c.name;
  CLI::App app{spec.program + ": known mix of " + spec.library + " primitives for accuracy tests"};
  app.add_option("--duration", opt.duration, "Measured window in seconds (after warm-up); 0 = until SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", opt.warmup, "Seconds of unmeasured mix before the window")->check(CLI::NonNegativeNumber);
  app.add_option("--slice-ms", opt.slice_ms, "Thread CPU per slice of one category")->check(CLI::PositiveNumber);
  app.add_option("--mix", opt.mix, "Target CPU shares, name=weight,... (unlisted = off). Names: " + names);
  app.add_flag("--with-p256", opt.with_p256, "Add ecdsa_p256 and ecdhe_p256 to the default mix");
  unsigned long long seed = 0;
  auto* seed_opt =
      app.add_option("--seed", seed,
                     "Draw the mix (weights, which categories, the share of ops made with a fresh context) from this "
                     "seed; --mix, if given too, replaces the drawn weights");
  app.add_option("--output", opt.output, "JSON written at exit");
  app.add_option("--ready-file", opt.ready_file, "Written (content: pid) when the measured window starts");
  CLI11_PARSE(app, argc, argv);
  if (seed_opt->count() > 0) opt.seed = seed;

  BlockStopSignals();

  auto& cats = spec.categories;
  for (auto& c : cats) c.weight = c.in_default_mix && (!c.needs_with_p256 || opt.with_p256) ? 1.0 : 0.0;
  if (opt.seed) {
    for (const auto& d : DrawSeededMix(*opt.seed)) {
      auto it = std::find_if(cats.begin(), cats.end(), [&](auto& c) { return c.name == d.name; });
      if (it != cats.end()) it->weight = d.weight, it->fresh_share = d.fresh_share;
    }
  }
  if (!opt.mix.empty() && !ApplyMix(opt.mix, cats)) return 2;
  double total_w = 0;
  for (auto& c : cats) total_w += c.weight;
  if (total_w <= 0) {
    std::fprintf(stderr, "--mix: at least one category needs a weight > 0\n");
    return 2;
  }

  // Setup outside any window: keys, peers, contexts, buffers.
  auto enabled = [&](std::string_view n) {
    return std::any_of(cats.begin(), cats.end(), [&](auto& c) { return c.name == n && c.weight > 0; });
  };
  if (opt.seed) {
    std::string drawn;
    for (const auto& c : cats) {
      if (c.weight > 0)
        drawn += " " + c.name + "=" + std::to_string(c.weight / total_w).substr(0, 5) + "/fresh " +
                 std::to_string(c.fresh_share).substr(0, 4);
    }
    std::fprintf(stderr, "%s: seed %llu, mix (share/fresh share):%s\n", spec.program.c_str(), *opt.seed, drawn.c_str());
  }
  if (!spec.setup(enabled) || !Calibrate(spec)) return 1;

  Window win;
  std::atomic<int> tid{0};
  std::atomic<bool> warm_done{false};
  std::thread worker(Worker, std::ref(spec), std::cref(opt), std::ref(win), std::ref(tid), std::ref(warm_done));

  // Wait out the warm-up (or a stop signal), then announce the window.
  while (!warm_done && !g_stop) {
    if (WaitForStopSignal(0.01) != 0) g_stop = true;
  }
  if (!g_stop && !opt.ready_file.empty() && !WriteFileAtomically(opt.ready_file, std::to_string(getpid()) + "\n")) {
    g_stop = true;
    g_failed = true;
  }
  if (!g_stop) {
    if (opt.duration > 0) {
      const double left = opt.duration - (NowNanos(CLOCK_MONOTONIC) - win.start_mono_ns) * 1e-9;
      if (left > 0) WaitForStopSignal(left);
    } else {
      WaitForStopSignal(0);
    }
  }
  g_stop = true;
  worker.join();

  long long sum_ns = 0;
  nlohmann::json out;
  out["pid"] = getpid();
  out["tid"] = tid.load();
  out["library"] = spec.library;
  out["seed"] = opt.seed ? nlohmann::json(*opt.seed) : nlohmann::json(nullptr);
  out["mix"] = nlohmann::json::object();
  for (const auto& c : cats) {
    if (c.weight > 0) out["mix"][c.name] = c.weight;
  }
  out["wall_seconds"] = (win.end_mono_ns - win.start_mono_ns) * 1e-9;
  out["thread_cpu_seconds"] = win.thread_cpu_ns * 1e-9;
  out["process_cpu_seconds"] = win.process_cpu_ns * 1e-9;
  out["window"] = {{"start_unix_ns", win.start_realtime_ns},
                   {"end_unix_ns", win.end_realtime_ns},
                   {"start_monotonic_ns", win.start_mono_ns},
                   {"end_monotonic_ns", win.end_mono_ns}};
  out["timeline"] = nlohmann::json::array();
  for (const auto& [mono_ns, cpu_ns] : win.timeline) out["timeline"].push_back({mono_ns, cpu_ns});
  out["slice_ms"] = opt.slice_ms;
  out["buffer_bytes"] = kGroundTruthBufferBytes;
  out["categories"] = nlohmann::json::array();
  for (auto& c : cats) {
    if (c.weight <= 0) continue;
    sum_ns += c.cpu_ns;
    out["categories"].push_back({{"name", c.name},
                                 {"bucket", c.bucket},
                                 {"algorithm", c.algorithm},
                                 {"target_share", c.weight / total_w},
                                 {"cpu_seconds", c.cpu_ns * 1e-9},
                                 {"ops", c.ops},
                                 {"fresh_share", c.fresh_share},
                                 {"fresh_ops", c.fresh_ops},
                                 {"bytes", c.ops * static_cast<long long>(c.bytes_per_op)}});
  }
  out["measured_cpu_seconds"] = sum_ns * 1e-9;
  // Thread CPU the slices did not cover: scheduling, clock reads, JSON.
  out["unmeasured_cpu_seconds"] = (win.thread_cpu_ns - sum_ns) * 1e-9;
  out["ok"] = !g_failed.load();

  const std::string text = out.dump(2) + "\n";
  if (!opt.output.empty()) {
    if (!WriteFileAtomically(opt.output, text)) return 1;
  } else {
    std::fputs(text.c_str(), stdout);
  }
  std::fprintf(stderr, "%s: window %.2fs, thread cpu %.3fs, measured %.3fs%s\n", spec.program.c_str(),
               (win.end_mono_ns - win.start_mono_ns) * 1e-9, win.thread_cpu_ns * 1e-9, sum_ns * 1e-9,
               g_failed ? " (FAILED, see above)" : "");
  return g_failed ? 1 : 0;
}

}  // namespace tlsprof::workload
