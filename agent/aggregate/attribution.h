// Attribution and aggregation: turns the sampler's per-(process, IP) counts
// into CPU time per process, bucket and algorithm.
//
// Semantics (docs/attribution.md): a sample with a user stack is TLS time when
// any frame lies in TLS library code — anywhere in a shared libssl/libcrypto,
// or inside a TLS symbol of a binary that links the library statically (node,
// Go, static OpenSSL); classify::ClassifyStack picks bucket, algorithm and
// phase. A sample without a stack is attributed by its leaf alone, in phase
// `other`.
// Not thread-safe: one thread owns an Attributor.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "agent/classify/classify.h"
#include "agent/discovery/process_registry.h"

namespace tlsprof::aggregate {

inline constexpr size_t kPhaseCount = 3;  // classify::Phase values

// One row of the algorithm table: algorithm names are static strings.
struct AlgorithmKey {
  classify::Bucket bucket = classify::Bucket::kOther;
  std::string_view algorithm;
  classify::Phase phase = classify::Phase::kOther;
  auto operator<=>(const AlgorithmKey&) const = default;
};

// An algorithm row and the kind of TLS library its samples ran in (the
// library of the innermost TLS frame): the fleet metrics' `library` label.
struct LibraryAlgorithmKey {
  AlgorithmKey algorithm;
  classify::LibraryKind library = classify::LibraryKind::kOpenSSL3;
  auto operator<=>(const LibraryAlgorithmKey&) const = default;
};

struct CryptoTime {
  uint64_t tls = 0;  // samples in TLS library code
  std::array<uint64_t, classify::kBucketCount> buckets{};
  std::array<uint64_t, kPhaseCount> phases{};
  std::map<AlgorithmKey, uint64_t> algorithms;
  // The same samples as `algorithms`, split by library kind as well.
  std::map<LibraryAlgorithmKey, uint64_t> library_algorithms;

  void Add(const classify::Classification& c, classify::Phase phase, classify::LibraryKind library, uint64_t count);
  void Merge(const CryptoTime& other);
};

// A TLS library file a process maps, as the report names it.
struct LibraryFile {
  std::string path;  // inside the process's mount namespace
  classify::LibraryKind kind = classify::LibraryKind::kOpenSSL3;
  bool shared = true;  // a shared libssl/libcrypto (TLS throughout), else a static link
  std::string build_id;
  std::string symbol_source;  // symbols::SymbolSourceName
  uint64_t symbol_count = 0;
  auto operator<=>(const LibraryFile&) const = default;
};

struct LibraryUse {
  LibraryFile file;
  uint64_t tls_samples = 0;        // TLS samples inside this file
  uint64_t named_samples = 0;      // of those, how many fell inside a named symbol
  uint64_t bucket_samples = 0;     // of those, how many got a bucket other than `other`
  uint64_t algorithm_samples = 0;  // of those, how many got an algorithm other than `unknown`
  uint64_t stack_samples = 0;      // of those, how many were attributed from a whole user stack
};

// Samples that fell in one TLS symbol (or in unnamed code of one library):
// the Attributor's key while it counts.
struct SymbolKey {
  const discovery::ImageInfo* image = nullptr;
  int64_t symbol = -1;  // index into image->image->symbols, -1 = unnamed
  auto operator<=>(const SymbolKey&) const = default;
};
struct SymbolCount {
  classify::Classification classification;
  uint64_t samples = 0;
};
// The same, named: what a window keeps once the images may be gone.
struct SymbolRow {
  std::string symbol;   // "[unnamed]" for code outside every symbol
  std::string library;  // the file's path
  classify::Classification classification;
  uint64_t samples = 0;
};

struct ProcessAttribution {
  pid_t pid = 0;
  std::string comm;
  discovery::ContainerIdentity container;  // from its cgroups; empty on the host
  uint64_t samples = 0;                    // user + kernel: the process's busy CPU
  uint64_t kernel_samples = 0;
  CryptoTime crypto;
  std::vector<LibraryUse> libraries;  // the TLS libraries it maps (with or without samples)
  // Where its TLS samples fell, for the report's top symbols: in (file,
  // symbol index) order, so that equal counts keep a stable order.
  std::vector<SymbolRow> symbols;
  // Samples whose algorithm no frame of their stack named, by how it was
  // inferred (Attributor::InferFromOperations): from the rest of the same
  // operation entry, or from the algorithms of the bucket (of the entry's
  // family) this process was seen to use.
  uint64_t inferred_from_operation = 0;
  uint64_t inferred_from_process = 0;
};

// One unique user stack with its attribution, for the folded and pprof
// exports. Frames leaf first, already symbolized.
struct StackSample {
  pid_t pid = 0;
  std::vector<std::string> frames;
  classify::Classification classification;
  classify::Phase phase = classify::Phase::kOther;
  uint64_t samples = 0;
};

struct Attribution {
  uint64_t scope_samples = 0;  // busy CPU of the scope (host or --pid set)
  CryptoTime crypto;
  std::map<pid_t, ProcessAttribution> processes;  // only processes with samples
  uint64_t unresolved_samples = 0;                // user IPs in processes the agent could not snapshot
  uint64_t stack_samples = 0;                     // TLS samples attributed from whole stacks
  // User samples whose leaf is the return address of a system call made
  // under TLS code (libc's write() from the socket BIO): kernel time, not TLS
  // time (docs/attribution.md, "System-call returns").
  uint64_t syscall_return_samples = 0;
  std::vector<StackSample> stacks;  // TLS stacks only
};

class StackCache;

class Attributor {
 public:
  // `cache`, if given, keeps what AddStack derived from each stack across
  // Attributors (windows); it must outlive this one. Without `keep_stacks`
  // the Attribution lists no stacks (Attribution::stacks, which only the
  // folded and pprof exports read); its counts are the same.
  explicit Attributor(const discovery::ProcessRegistry& registry, StackCache* cache = nullptr, bool keep_stacks = true);
  ~Attributor();

  // Busy CPU of one process (from samples_by_pid).
  void AddProcess(uint32_t tgid, uint64_t user_samples, uint64_t kernel_samples);
  // One user stack, leaf first (from samples_by_stack). Call before
  // AddUserSamples: the samples a stack covers are taken out of its leaf IP's
  // count, so each sample is attributed once. A TLS stack whose leaf lies
  // outside TLS code, right after a syscall instruction, is counted as the
  // process's kernel time instead.
  void AddStack(uint32_t tgid, std::span<const uint64_t> ips, uint64_t count);
  // User-mode samples at one IP (from samples_by_ip), attributed by the leaf.
  void AddUserSamples(uint32_t tgid, uint64_t ip, uint64_t count);
  // The scope's busy CPU; for the host this is all non-idle samples, which
  // includes processes whose pid entry could not be stored.
  void SetScopeSamples(uint64_t samples) { profile_.scope_samples = samples; }

  // Completes the profile: algorithms left unknown inside an operation are
  // inferred from what the same operation named (InferFromOperations).
  Attribution Finish();

  // Where one user IP of a process lies. `return_address`: the IP is a
  // caller's return address, so the call instruction is at ip - 1.
  struct Frame {
    SymbolKey where;        // image null: not in a file the agent knows
    std::string_view name;  // empty when unnamed
    classify::Family family = classify::Family::kOpenSSL;
    bool tls = false;  // TLS library code
    // The rules table's verdict on the symbol, for TLS code (Resolve's
    // `classify`; a stack's frames get it only when its verdict is not cached).
    std::optional<classify::Classification> leaf;
    // At a return address: the imported TLS function its call instruction
    // called (symbols::ImportCalls), which a tail call may have left without
    // a frame of its own.
    std::string_view called;
    // The address in the file that was looked up (at a return address, the
    // call's), 0 when no mapping's segment says.
    uint64_t vaddr = 0;
  };
  Frame Resolve(const discovery::ProcessSnapshot& process, uint64_t ip, bool return_address, bool classify = true);
  // Sets a TLS frame's `leaf` (Resolve does unless told not to).
  static void ClassifyFrame(Frame& f);

  // What AddStack derives from one resolved stack of one snapshot, before
  // counting: a function of the stack's frames and the snapshot alone (its
  // mappings and images), so it is kept across windows (StackCache). Names
  // and pointers point into the snapshot's images, valid while it lives.
  struct StackVerdict {
    enum class Kind : uint8_t {
      kNotTls,         // no TLS frame: nothing to count
      kSyscallReturn,  // TLS stack, leaf at a system call's return: the process's kernel time
      kTls,
    };
    Kind kind = Kind::kNotTls;
    classify::Classification classification;
    classify::Phase phase = classify::Phase::kOther;
    Frame innermost_tls;  // the frame the samples are accounted to
    // The operation group the samples join (InferFromOperations), if any.
    bool grouped = false;
    const discovery::ImageInfo* entry_image = nullptr;
    std::string_view entry;
    classify::Family entry_family{};
    uint64_t callee_site = 0;
    std::string_view callee;
    std::string_view candidate;
    SymbolKey caller;          // the frame that called the entry (OperationKey::caller)
    uint64_t caller_site = 0;  // its function's start when it has no symbol
    // Named for the exports, leaf first: symbol names of the snapshot's
    // images, or names the StackCache holds.
    std::vector<std::string_view> frames;
  };

 private:
  void CountOperation(uint32_t tgid, const StackVerdict& v, uint64_t count, std::optional<size_t> stack_index);
  void Account(ProcessAttribution& p, const Frame& where, const classify::Classification& c, classify::Phase phase,
               uint64_t count, bool from_stack);
  ProcessAttribution& Process(uint32_t tgid);

  const discovery::ProcessRegistry& registry_;
  std::unique_ptr<StackCache> own_stack_cache_;  // when none is given: this window's only
  StackCache* stack_cache_ = nullptr;
  bool keep_stacks_ = true;
  Attribution profile_;
  // Per process: the images behind ProcessAttribution::libraries (same order),
  // and its symbol counts, named at Finish().
  std::map<pid_t, std::vector<const discovery::ImageInfo*>> library_images_;
  std::map<pid_t, std::map<SymbolKey, SymbolCount>> symbols_;
  // (tgid, leaf ip) → samples already attributed through a stack.
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> covered_;

  // Samples of one operation entry point (the outermost of the stack's bucket
  // that names an algorithm family, else the outermost) in one process. Part of an operation never names its algorithm
  // (ECDSA's nonce generation runs in the DRBG and bignum code, no frame
  // says the curve); those samples take the algorithms that the rest of the
  // same operation, in the same process, named — see InferFromOperations().
  // When the function the entry point called has no name (a stripped
  // library), the group is split by the call site inside that function (its
  // return address): one entry point dispatching to several unexported
  // implementations (BoringSSL's EVP_AEAD_CTX_seal: AES-GCM, ChaCha20-Poly1305)
  // must not lend one implementation's name to another. Groups are split by
  // the entry's caller too (OperationKey::caller), whose mix a set-up takes.
  struct OperationGroup {
    classify::Bucket bucket = classify::Bucket::kOther;
    classify::Family family{};  // the entry's rules family and name
    std::string_view entry;
    std::map<std::string_view, uint64_t> named;   // algorithm → samples
    std::array<uint64_t, kPhaseCount> unknown{};  // samples per phase with algorithm "unknown"
    std::map<std::pair<classify::Phase, classify::LibraryKind>, uint64_t> unknown_by_library;  // the same, by library
    std::vector<size_t> unknown_stacks;  // indexes into profile_.stacks
  };
  struct OperationKey {
    pid_t pid = 0;
    // The entry frame's image and name: an entry recovered from a call site
    // (ImportCalls) has no symbol index of its own.
    const discovery::ImageInfo* image = nullptr;
    std::string_view entry;
    uint64_t callee_site = 0;  // return address in the unnamed function it called; 0 when that is named
    std::string_view callee;   // the named operation entry it called, if any (of the same bucket)
    // The one report algorithm a provider function below the entry may be
    // (classify::SoleNamedCandidate: AES-GCM for AES-GCM|ARIA-GCM), if any.
    std::string_view candidate;
    // The function that called the entry (the frame above it): its image and
    // symbol, or, unnamed, its start by the file's .eh_frame_hdr (else the
    // call site). The caller chose the algorithm, so
    // what its other calls of the bucket named is the best guess for the
    // samples its set-up left unnamed (InferFromOperations). Image null when
    // the entry is the outermost frame or its caller lies in no mapping.
    SymbolKey caller;
    uint64_t caller_site = 0;
    auto operator<=>(const OperationKey&) const = default;
  };
  std::map<OperationKey, OperationGroup> operations_;
  // Per (process, bucket, caller, caller_site): the algorithms its stacks
  // named, before inference; the whole process's under the empty caller
  // (SymbolKey{}, 0).
  using SeenAlgorithms =
      std::map<std::tuple<pid_t, classify::Bucket, SymbolKey, uint64_t>, std::map<std::string_view, uint64_t>>;
  // What `key`'s caller named in `bucket` (`caller_only`), or the whole
  // process; null if nothing.
  static const std::map<std::string_view, uint64_t>* Seen(const SeenAlgorithms& seen, const OperationKey& key,
                                                          classify::Bucket bucket, bool caller_only);
  // A key context's samples (EVP_PKEY_CTX_new: bucket `other`, algorithm
  // unknown) moved to the signature and key-exchange algorithms its caller,
  // else the process, named, in proportion.
  void SplitKeyContext(const OperationKey& key, const OperationGroup& group, const SeenAlgorithms& seen);
  void InferFromOperations();
};

// Stack verdicts kept across windows: a TLS server's stacks repeat from one
// window to the next, and judging each again (the operation, the phase, the
// frames' names) would make every window cost what the first did.
//
// Keyed by the process, its snapshot's generation and a 128-bit hash of what
// the verdict depends on (the frames' files and symbols, and the IPs of
// frames without a name), never by IPs themselves: a walk's last frame may be
// a word of the user stack (docs/attribution.md, "Privacy"), which is not
// kept past its window. A snapshot read again gets a new generation, so a
// verdict is only ever used with the mappings and images it was made from.
// Verdicts unused for kIdleWindows windows go (NextWindow), and at most
// kMaxEntries are kept (a few hundred bytes each), so memory follows the
// stacks in use.
// Not thread-safe: the thread that closes windows owns it.
class StackCache {
 public:
  static constexpr size_t kMaxEntries = 16384;
  static constexpr uint64_t kIdleWindows = 12;
  static constexpr size_t kMaxNames = 16384;

  struct Key {
    uint32_t tgid = 0;
    uint64_t generation = 0;
    uint64_t hash[2] = {};
    bool operator==(const Key&) const = default;
  };
  static Key KeyOf(uint32_t tgid, uint64_t generation, std::span<const uint64_t> words);

  // The verdict for `key`, or null.
  const Attributor::StackVerdict* Find(const Key& key);
  // Keeps `verdict` (unless the cache is full) and returns it.
  const Attributor::StackVerdict& Insert(const Key& key, Attributor::StackVerdict verdict);
  // A frame name made for the exports ("[libssl.so.3]"), held as long as
  // the verdicts are.
  std::string_view Intern(std::string name);
  // Starts a window: verdicts unused for kIdleWindows windows go.
  void NextWindow();

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  size_t size() const { return entries_.size(); }

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.hash[0]); }
  };
  struct Entry {
    Attributor::StackVerdict verdict;
    uint64_t last_window = 0;
  };
  std::unordered_map<Key, Entry, KeyHash> entries_;
  std::unordered_set<std::string> names_;  // node-based: views of them stay valid
  Attributor::StackVerdict overflow_;      // Insert's answer when full
  uint64_t window_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace tlsprof::aggregate
