// The library-independent half of the ground-truth workloads
// (tlsprof-groundtruth, -shared, -boringssl): CLI, mix scheduling, the
// measured worker thread and the JSON report. Each TLS library supplies only
// its categories (one closure per primitive) and a setup function, so every
// variant has the same flags, the same scheduling and the same JSON and the
// accuracy tests can treat them alike. Free of any TLS library header.
//
// Not thread-safe: RunGroundTruth() is meant to be called once, from main().
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tlsprof::workload {

// Size of one bulk op (a TLS record's worth): libraries size their buffers
// with it, and the JSON reports it as buffer_bytes.
inline constexpr size_t kGroundTruthBufferBytes = 16 * 1024;

// One operation of a category, two ways, as real callers make it: `reused`
// keeps its context (cipher context, digest context, key context) across
// calls; `fresh` makes the whole API sequence each time (context creation,
// init with its fetch and key schedule, the operation, free). Each returns
// false on error. A library without a context to make for an operation
// passes the same closure twice.
struct GroundTruthOp {
  std::function<bool()> reused, fresh;
};

// One measured category. The library fills in the first block; the runner
// owns the rest.
struct GroundTruthCategory {
  std::string name;              // --mix name, e.g. "aes_gcm"
  std::string bucket;            // cipher, hash, signature, key_exchange
  std::string algorithm;         // AES-GCM, SHA-256, ...
  bool needs_with_p256 = false;  // off in the default mix unless --with-p256
  size_t bytes_per_op = 0;       // 0 for public-key operations
  GroundTruthOp op;
  bool in_default_mix = true;  // false: only by --mix or --seed (the post-quantum ones)

  // Runner state.
  double weight = 0;
  double fresh_share = 0;         // share of ops made with a fresh context
  double fresh_acc = 0;           // spreads the fresh ops evenly (see Run)
  int batch = 1;                  // ops between clock reads, sized by calibration
  long long cpu_ns = 0, ops = 0;  // measured window only
  long long fresh_ops = 0;        // of ops, those made fresh
  long long warm_cpu_ns = 0;      // warm-up, kept apart from the window

  // One operation: fresh for a fresh_share of the calls, evenly spread (an
  // accumulator, so a seed gives the same sequence every run).
  bool Run(bool measuring) {
    fresh_acc += fresh_share;
    if (fresh_acc >= 1) {
      fresh_acc -= 1;
      if (measuring) ++fresh_ops;
      return op.fresh();
    }
    return op.reused();
  }
};

// The operations of the nine categories every variant measures, and of the
// post-quantum ones a library may have (left empty: the variant lacks them).
struct GroundTruthOps {
  GroundTruthOp aes_gcm, chacha20_poly1305, aes_cbc, sha256, sha1, rsa, x25519, ecdsa_p256, ecdhe_p256;
  GroundTruthOp ml_kem_768, ml_dsa_65;
};

// The seeded mix, the same draw as tlsprof-go-groundtruth's so one seed gives
// one mix in every variant: splitmix64 from the seed; for each of the eleven
// standard categories in report order (the post-quantum two last), three
// uniform draws u1 u2 u3 in [0,1):
// weight 0.25 * 16^u1 (log-uniform over [0.25, 4]), dropped when u2 < 0.2,
// fresh share u3. Categories a variant lacks are then off; if fewer than two
// are left on, dropped ones come back in report order until two are.
struct SeededDraw {
  std::string name;
  double weight = 0;  // 0 = dropped
  double fresh_share = 0;
};
std::vector<SeededDraw> DrawSeededMix(unsigned long long seed);
// The categories, in report order, with their names, buckets, algorithms and
// bytes per op: the same in every variant, so the tests can treat them alike.
std::vector<GroundTruthCategory> StandardCategories(GroundTruthOps ops);

struct GroundTruthSpec {
  std::string program;  // binary name, for messages and --help
  std::string library;  // written to the JSON as "library" (openssl, boringssl)
  std::vector<GroundTruthCategory> categories;
  // Makes keys, peers and contexts for the categories `enabled(name)` says
  // are on. Runs before anything is measured. Prints why and returns false
  // on failure.
  std::function<bool(const std::function<bool(std::string_view)>& enabled)> setup;
  // Prints "<program>: <what> failed: <the library's error queue>".
  std::function<void(const std::string& what)> report_failure;
};

// Parses the command line, runs setup, calibration, warm-up and the measured
// window, writes the JSON, and returns the process exit code (0 ok, 1 setup
// or operation failure, 2 bad flags). The categories' closures must stay
// valid until it returns.
int RunGroundTruth(int argc, char** argv, GroundTruthSpec spec);

}  // namespace tlsprof::workload
