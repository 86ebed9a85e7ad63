#include "agent/aggregate/attribution.h"

#include <algorithm>

#include "common/hash.h"

namespace tlsprof::aggregate {

void CryptoTime::Add(const classify::Classification& c, classify::Phase phase, classify::LibraryKind library,
                     uint64_t count) {
  tls += count;
  buckets[static_cast<size_t>(c.bucket)] += count;
  phases[static_cast<size_t>(phase)] += count;
  algorithms[{c.bucket, c.algorithm, phase}] += count;
  library_algorithms[{{c.bucket, c.algorithm, phase}, library}] += count;
}

void CryptoTime::Merge(const CryptoTime& other) {
  tls += other.tls;
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
  for (size_t i = 0; i < phases.size(); ++i) phases[i] += other.phases[i];
  for (const auto& [key, count] : other.algorithms) algorithms[key] += count;
  for (const auto& [key, count] : other.library_algorithms) library_algorithms[key] += count;
}

namespace {

// The shares of `n` samples in proportion to `weights` (which sum to
// `total` > 0), the rounding remainder to the heaviest (the first of equals).
std::vector<uint64_t> Shares(const std::vector<uint64_t>& weights, uint64_t total, uint64_t n) {
  std::vector<uint64_t> out;
  out.reserve(weights.size());
  uint64_t given = 0;
  size_t heaviest = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    out.push_back(n * weights[i] / total);
    given += out.back();
    if (weights[i] > weights[heaviest]) heaviest = i;
  }
  if (!out.empty()) out[heaviest] += n - given;
  return out;
}

// Takes `n` samples off rows[key] (at most what it has), dropping an emptied row.
template <typename Key>
void Take(std::map<Key, uint64_t>& rows, const Key& key, uint64_t n) {
  auto it = rows.find(key);
  if (it == rows.end()) return;
  it->second -= std::min(it->second, n);
  if (it->second == 0) rows.erase(it);
}

// Moves `unknown` samples of (bucket, unknown algorithm, phase) in `rows` to
// the algorithms `named` (algorithm → samples), in proportion (Shares);
// `key(algorithm)` makes a row key.
template <typename Key, typename MakeKey>
void SplitUnknown(std::map<Key, uint64_t>& rows, const std::map<std::string_view, uint64_t>& named,
                  uint64_t named_total, uint64_t unknown, MakeKey key) {
  std::vector<uint64_t> weights;
  for (const auto& [alg, n] : named) weights.push_back(n);
  const std::vector<uint64_t> share = Shares(weights, named_total, unknown);
  size_t i = 0;
  for (const auto& [alg, n] : named) rows[key(alg)] += share[i++];
  Take(rows, key(classify::algo::kUnknown), unknown);
}

LibraryFile LibraryFileOf(const discovery::ImageInfo& info) {
  LibraryFile file;
  file.path = info.path;
  file.kind = info.tls->kind;
  file.shared = info.tls->whole_file_is_tls;
  if (info.image) {
    file.build_id = info.image->build_id;
    file.symbol_source = symbols::SymbolSourceName(info.image->symbol_source);
    file.symbol_count = info.image->symbols.size();
  }
  return file;
}

}  // namespace

Attributor::Attributor(const discovery::ProcessRegistry& registry, StackCache* cache, bool keep_stacks)
    : registry_(registry),
      own_stack_cache_(cache == nullptr ? std::make_unique<StackCache>() : nullptr),
      stack_cache_(cache != nullptr ? cache : own_stack_cache_.get()),
      keep_stacks_(keep_stacks) {}

Attributor::~Attributor() = default;

ProcessAttribution& Attributor::Process(uint32_t tgid) {
  auto [it, inserted] = profile_.processes.try_emplace(static_cast<pid_t>(tgid));
  ProcessAttribution& p = it->second;
  if (inserted) {
    p.pid = static_cast<pid_t>(tgid);
    if (const auto* snap = registry_.Get(p.pid)) {
      p.comm = snap->comm;
      p.container = snap->container;
      std::vector<const discovery::ImageInfo*>& images = library_images_[p.pid];
      for (const auto& m : snap->mappings) {
        if (!m.image || !m.image->tls || std::find(images.begin(), images.end(), m.image.get()) != images.end()) {
          continue;
        }
        images.push_back(m.image.get());
        p.libraries.push_back({.file = LibraryFileOf(*m.image)});
      }
    }
  }
  return p;
}

void Attributor::AddProcess(uint32_t tgid, uint64_t user_samples, uint64_t kernel_samples) {
  ProcessAttribution& p = Process(tgid);
  p.samples += user_samples + kernel_samples;
  p.kernel_samples += kernel_samples;
}

Attributor::Frame Attributor::Resolve(const discovery::ProcessSnapshot& process, uint64_t ip, bool return_address,
                                      bool classify) {
  Frame f;
  const auto* m = process.Find(ip);
  if (m == nullptr || !m->image || !m->image->image) return f;
  const discovery::ImageInfo& info = *m->image;
  const symbols::BinaryImage& img = *info.image;
  f.where.image = &info;
  const uint64_t lookup = return_address ? ip - 1 : ip;
  // The same bias as the unwinder's (UnwindRegistrar): from the mapping's
  // own segment, not from whichever segment holds the ip's file offset.
  auto base = img.MappingVaddr(m->mapping.offset, /*executable=*/true);
  auto vaddr = base ? std::optional<uint64_t>(*base + (lookup - m->mapping.start)) : std::nullopt;
  f.vaddr = vaddr.value_or(0);
  if (return_address && vaddr && !img.import_calls.empty()) {
    f.called = img.import_calls.CalleeAt(*vaddr + 1).value_or(std::string_view{});
  }
  if (!info.tls) return f;  // code outside TLS libraries: no name is needed
  auto index = vaddr ? img.symbols.Find(*vaddr) : std::nullopt;
  f.family = classify::FamilyOf(info.tls->kind);
  if (index) {
    f.where.symbol = *index;
    f.name = img.symbols.at(*index).name;
  }
  // A shared libssl/libcrypto is TLS code throughout, named or not; in a
  // static link the kept symbols are (the TLS names and the helpers of their
  // objects, LoadOptions::keep_whole_objects), as the unwinder's rows say.
  f.tls = info.tls->whole_file_is_tls || index.has_value();
  if (classify) ClassifyFrame(f);
  return f;
}

void Attributor::ClassifyFrame(Frame& f) {
  if (!f.tls) return;
  // Looked up once per name (classify.cc); unnamed or unknown: {other, unknown}.
  f.leaf = f.name.empty() ? classify::Classification{}
                          : classify::ClassifySymbol(f.family, f.name).value_or(classify::Classification{});
}

void Attributor::Account(ProcessAttribution& p, const Frame& where, const classify::Classification& c,
                         classify::Phase phase, uint64_t count, bool from_stack) {
  p.crypto.Add(c, phase, where.where.image->tls->kind, count);
  SymbolCount& sym = symbols_[p.pid][where.where];
  sym.classification = where.leaf.value_or(c);
  sym.samples += count;
  const std::vector<const discovery::ImageInfo*>& images = library_images_[p.pid];
  for (size_t i = 0; i < images.size() && i < p.libraries.size(); ++i) {
    if (images[i] != where.where.image) continue;
    LibraryUse& u = p.libraries[i];
    u.tls_samples += count;
    if (where.where.symbol >= 0) u.named_samples += count;
    if (c.bucket != classify::Bucket::kOther) u.bucket_samples += count;
    if (c.algorithm != classify::algo::kUnknown) u.algorithm_samples += count;
    if (from_stack) u.stack_samples += count;
  }
}

namespace {

using Frame = Attributor::Frame;
using StackVerdict = Attributor::StackVerdict;

// A stack's frames, innermost first, each with its IP.
struct StackFrames {
  static constexpr size_t kMaxFrames = 64;  // of the sampled stack; put-back entries come on top
  std::array<Frame, 2 * kMaxFrames> frames;
  std::array<uint64_t, 2 * kMaxFrames> ips;
  size_t size = 0;

  void Push(const Frame& f, uint64_t ip) {
    ips[size] = ip;
    frames[size++] = f;
  }
};

// The TLS entry point `called` that a caller's call instruction called, in
// the library of `callee` (the frame below it, which is not that function).
Frame PutBackEntry(const Frame& callee, std::string_view called) {
  Frame entry;
  entry.where.image = callee.where.image;
  entry.name = called;
  entry.family = callee.family;
  entry.tls = true;
  entry.leaf = classify::ClassifySymbol(entry.family, entry.name).value_or(classify::Classification{});
  return entry;
}

// Frames innermost first. Where a caller's return address says which TLS
// entry point it called and the callee's frame is not that function (the
// entry tail-called away, e.g. EVP_PKEY_sign into the provider), the entry
// is put back between them, so the operation it starts is seen.
// Into `s` (reused from stack to stack: its arrays are not constructed
// again), without the frames' classification, which only a stack whose
// verdict is not cached needs (Attributor::ClassifyFrame).
void ResolveStack(Attributor& attributor, const discovery::ProcessSnapshot& snap, std::span<const uint64_t> ips,
                  StackFrames& s) {
  s.size = 0;
  const size_t n = std::min(ips.size(), StackFrames::kMaxFrames);
  for (size_t i = 0; i < n; ++i) {
    Frame f = attributor.Resolve(snap, ips[i], i > 0, /*classify=*/false);
    const Frame* below = s.size > 0 ? &s.frames[s.size - 1] : nullptr;
    if (!f.called.empty() && below != nullptr && below->tls && below->name != f.called) {
      s.Push(PutBackEntry(*below, f.called), ips[i]);
    }
    s.Push(f, ips[i]);
  }
}

// The operation entry whose samples are pooled for InferFromOperations: the
// outermost one of the stack's bucket that names an algorithm family
// (ecdsa_sign: some ECDSA curve), else the outermost generic one
// (EVP_PKEY_sign, which RSA and ECDSA share). Its index; nullopt if none.
std::optional<size_t> FindOperation(const StackFrames& s, classify::Bucket bucket) {
  std::optional<size_t> operation;
  for (size_t i = s.size; i-- > 0;) {
    const Frame& f = s.frames[i];
    if (!f.tls || f.name.empty()) continue;
    auto op = classify::ClassifyOperation(f.family, f.name);
    if (!op || op->bucket != bucket) continue;
    if (classify::IsSpecificOperation(f.family, f.name)) return i;
    if (!operation) operation = i;
  }
  return operation;
}

// What the entry point at `operation` dispatched to, which splits its group.
struct Callee {
  uint64_t site = 0;      // an unnamed callee: the call site inside it (its return address)
  std::string_view name;  // a named callee that is an operation entry of the bucket
};

// When the callee has no name (stripped code), the call site inside it.
// BoringSSL's EVP_AEAD_CTX_seal calls aead_aes_gcm_seal_scatter or the
// ChaCha20-Poly1305 one, both unexported; only the GCM path reaches an
// exported, named function (CRYPTO_gcm128_*), so without this the ChaCha20
// samples would take AES-GCM's name. A named callee that is itself an
// operation entry of the bucket splits the group by its name the same way:
// over a stripped libcrypto.so.3 named from its provider tables
// (library_tables.h), EVP_EncryptUpdate calls the ChaCha20-Poly1305 update,
// the AES-GCM|ARIA-GCM one or the generic block-cipher one, and the last
// must not take the others' names. Any other named callee keeps the group
// whole.
Callee CalleeOf(const StackFrames& s, size_t operation, classify::Bucket bucket) {
  Callee c;
  if (operation == 0) return c;
  const Frame& below = s.frames[operation - 1];
  if (below.name.empty()) {
    c.site = s.ips[operation - 1];
  } else if (below.tls) {
    auto op = classify::ClassifyOperation(below.family, below.name);
    if (op && op->bucket == bucket) c.name = below.name;
  }
  return c;
}

// A provider function below the entry that the tables share with algorithms
// that have no report name: the one that has (innermost first).
std::string_view CandidateBelow(const StackFrames& s, size_t operation) {
  for (size_t i = 0; i < operation; ++i) {
    const Frame& f = s.frames[i];
    if (!f.tls || f.name.empty()) continue;
    std::string_view candidate = classify::SoleNamedCandidate(f.family, f.name);
    if (!candidate.empty()) return candidate;
  }
  return {};
}

// A frame as the exports name it.
std::string FrameName(const Frame& f, uint64_t ip, bool leaf) {
  if (!f.name.empty()) return std::string(f.name);
  // Privacy (docs/attribution.md): a caller's "return address" outside every
  // mapping is a word the in-kernel walk read from the user stack where its
  // rows said a return address would be, and it was none (the walk stops
  // there, no_mapping): it may be any data the stack held. Only the leaf, a
  // register's program counter, is known to be a code address.
  if (f.where.image == nullptr) return leaf ? fmt::format("[unknown+0x{:x}]", ip) : std::string("[unknown]");
  const std::string& path = f.where.image->path;
  size_t slash = path.rfind('/');
  return fmt::format("[{}]", slash == std::string::npos ? path : path.substr(slash + 1));
}

// The function of an unnamed frame, as its file's .eh_frame_hdr tells
// functions apart (symbols::BinaryImage::FunctionStartAt), so that an
// application's several calls into the library from one function count as
// one caller; the frame's own address `ip` where the file has no table.
uint64_t UnnamedFunctionOf(const Frame& f, uint64_t ip) {
  const symbols::BinaryImage* img = f.where.image->image.get();
  if (img == nullptr || f.vaddr == 0) return ip;
  return img->FunctionStartAt(f.vaddr).value_or(ip);
}

// What AddStack counts for the resolved stack `s` of a snapshot.
StackVerdict Judge(const discovery::ProcessRegistry& registry, StackCache& cache,
                   const discovery::ProcessSnapshot& snap, const StackFrames& s) {
  StackVerdict v;
  std::array<classify::FrameInfo, 2 * StackFrames::kMaxFrames> infos;
  const Frame* innermost_tls = nullptr;
  for (size_t i = 0; i < s.size; ++i) {
    infos[i] = {s.frames[i].name, s.frames[i].family, s.frames[i].tls};
    if (s.frames[i].tls && innermost_tls == nullptr) innermost_tls = &s.frames[i];
  }
  const classify::StackClassification sc = classify::ClassifyStack({infos.data(), s.size});
  if (!sc.tls || innermost_tls == nullptr) return v;
  if (!s.frames[0].tls && s.frames[0].where.image != nullptr &&
      registry.IsSyscallReturn(*snap.Find(s.ips[0]), s.ips[0])) {
    // The timer fired inside the system call (socket I/O of a BIO, a lock's
    // futex) and the sample was taken on its return to user mode: the CPU
    // went to the kernel, not to TLS code.
    v.kind = StackVerdict::Kind::kSyscallReturn;
    return v;
  }
  v.kind = StackVerdict::Kind::kTls;
  v.classification = sc.classification;
  v.phase = sc.phase;
  v.innermost_tls = *innermost_tls;
  const classify::Bucket bucket = sc.classification.bucket;
  const std::optional<size_t> operation_index = FindOperation(s, bucket);
  const Frame* operation = operation_index ? &s.frames[*operation_index] : nullptr;
  // Bucket `other` has groups only for a key's context (EVP_PKEY_CTX_new),
  // whose bucket is inferred too.
  if (operation != nullptr &&
      (bucket != classify::Bucket::kOther || classify::IsKeyContext(operation->family, operation->name))) {
    const Callee callee = CalleeOf(s, *operation_index, bucket);
    v.grouped = true;
    v.entry_image = operation->where.image;
    v.entry = operation->name;
    v.entry_family = operation->family;
    v.callee_site = callee.site;
    v.callee = callee.name;
    v.candidate = CandidateBelow(s, *operation_index);
    if (*operation_index + 1 < s.size) {
      // A caller in no mapping may be a word of the user stack, not a return
      // address (FrameName): it is not a caller.
      const Frame& caller = s.frames[*operation_index + 1];
      if (caller.where.image != nullptr) {
        v.caller = caller.where;
        if (caller.where.symbol < 0) v.caller_site = UnnamedFunctionOf(caller, s.ips[*operation_index + 1]);
      }
    }
  }
  v.frames.reserve(s.size);
  for (size_t i = 0; i < s.size; ++i) {
    const Frame& f = s.frames[i];
    v.frames.push_back(!f.name.empty() ? f.name : cache.Intern(FrameName(f, s.ips[i], /*leaf=*/i == 0)));
  }
  return v;
}

// What a resolved stack's verdict depends on, as words to hash
// (StackCache::KeyOf): per frame its file and symbol, the entry its call
// site called, and where the frame has no name (code outside TLS symbols,
// unnamed code) its IP, which the verdict may use (a system call's return,
// an unnamed callee's call site, an unnamed leaf's name). Leaf IPs inside one
// symbol thus share one verdict.
size_t StackIdentity(const StackFrames& s, std::span<uint64_t> out) {
  size_t n = 0;
  for (size_t i = 0; i < s.size && n + 3 <= out.size(); ++i) {
    const Frame& f = s.frames[i];
    out[n++] = reinterpret_cast<uintptr_t>(f.where.image);
    out[n++] = f.where.symbol >= 0 ? static_cast<uint64_t>(f.where.symbol) << 1 : s.ips[i] << 1 | 1;
    out[n++] = reinterpret_cast<uintptr_t>(f.called.data()) ^ (f.tls ? 1 : 0) ^ f.called.size() << 48;
  }
  return n;
}

}  // namespace

void Attributor::AddStack(uint32_t tgid, std::span<const uint64_t> ips, uint64_t count) {
  if (ips.empty()) return;
  const auto* snap = registry_.Get(static_cast<pid_t>(tgid));
  if (snap == nullptr) return;  // left to the leaf path, which counts it unresolved
  covered_[{tgid, ips[0]}] += count;

  // One per thread, reused: 128 frames are too many to construct per stack.
  thread_local StackFrames s;
  ResolveStack(*this, *snap, ips, s);
  std::array<uint64_t, 3 * 2 * StackFrames::kMaxFrames> words;
  const size_t n = StackIdentity(s, words);
  const StackCache::Key key = StackCache::KeyOf(tgid, snap->generation, std::span(words.data(), n));
  explicit_bzero(words.data(), n * sizeof(words[0]));  // IPs of the user stack (docs/attribution.md, "Privacy")
  const StackVerdict* v = stack_cache_->Find(key);
  if (v == nullptr) {
    for (size_t i = 0; i < s.size; ++i) ClassifyFrame(s.frames[i]);
    v = &stack_cache_->Insert(key, Judge(registry_, *stack_cache_, *snap, s));
  }
  explicit_bzero(s.ips.data(), s.size * sizeof(s.ips[0]));
  if (v->kind == StackVerdict::Kind::kNotTls) return;
  if (v->kind == StackVerdict::Kind::kSyscallReturn) {
    Process(tgid).kernel_samples += count;
    profile_.syscall_return_samples += count;
    return;
  }
  ProcessAttribution& p = Process(tgid);
  Account(p, v->innermost_tls, v->classification, v->phase, count, /*from_stack=*/true);
  profile_.stack_samples += count;

  if (!keep_stacks_) {
    if (v->grouped) CountOperation(tgid, *v, count, std::nullopt);
    return;
  }
  StackSample stack;
  stack.pid = static_cast<pid_t>(tgid);
  stack.classification = v->classification;
  stack.phase = v->phase;
  stack.samples = count;
  stack.frames.assign(v->frames.begin(), v->frames.end());
  profile_.stacks.push_back(std::move(stack));
  if (v->grouped) CountOperation(tgid, *v, count, profile_.stacks.size() - 1);
}

// A stack of an operation entry, in its group (InferFromOperations).
void Attributor::CountOperation(uint32_t tgid, const StackVerdict& v, uint64_t count,
                                std::optional<size_t> stack_index) {
  OperationGroup& group = operations_[{static_cast<pid_t>(tgid), v.entry_image, v.entry, v.callee_site, v.callee,
                                       v.candidate, v.caller, v.caller_site}];
  group.bucket = v.classification.bucket;
  group.family = v.entry_family;
  group.entry = v.entry;
  if (v.classification.algorithm == classify::algo::kUnknown) {
    group.unknown[static_cast<size_t>(v.phase)] += count;
    group.unknown_by_library[{v.phase, v.innermost_tls.where.image->tls->kind}] += count;
    if (stack_index) group.unknown_stacks.push_back(*stack_index);
  } else {
    group.named[v.classification.algorithm] += count;
  }
}

void Attributor::AddUserSamples(uint32_t tgid, uint64_t ip, uint64_t count) {
  if (auto it = covered_.find({tgid, ip}); it != covered_.end()) {
    const uint64_t taken = std::min(count, it->second);
    count -= taken;
    it->second -= taken;
    if (count == 0) return;
  }
  const auto* snap = registry_.Get(static_cast<pid_t>(tgid));
  if (snap == nullptr) {
    profile_.unresolved_samples += count;
    return;
  }
  Frame f = Resolve(*snap, ip, false);
  if (!f.tls) return;
  Account(Process(tgid), f, *f.leaf, classify::Phase::kOther, count, /*from_stack=*/false);
}

const std::map<std::string_view, uint64_t>* Attributor::Seen(const SeenAlgorithms& seen, const OperationKey& key,
                                                             classify::Bucket bucket, bool caller_only) {
  if (caller_only && key.caller.image == nullptr) return nullptr;
  auto it = caller_only ? seen.find({key.pid, bucket, key.caller, key.caller_site})
                        : seen.find({key.pid, bucket, SymbolKey{}, 0});
  return it == seen.end() ? nullptr : &it->second;
}

void Attributor::SplitKeyContext(const OperationKey& key, const OperationGroup& group, const SeenAlgorithms& seen) {
  // The signature and key-exchange algorithms named under the same caller,
  // else anywhere in this process's stacks, by CPU. A context is made per
  // operation, not per CPU second, so the process-wide mix gives cheap
  // operations (X25519) less than their share of it and costly ones (RSA)
  // more; the report counts these samples as inferred_from_process.
  const pid_t pid = key.pid;
  std::vector<std::pair<AlgorithmKey, uint64_t>> named;  // phase set per use
  uint64_t named_total = 0;
  for (bool caller_only : {true, false}) {
    for (classify::Bucket b : {classify::Bucket::kSignature, classify::Bucket::kKeyExchange}) {
      const auto* mix = Seen(seen, key, b, caller_only);
      if (mix == nullptr) continue;
      for (const auto& [alg, n] : *mix) named.push_back({{b, alg, classify::Phase::kOther}, n}), named_total += n;
    }
    if (named_total > 0) break;
  }
  auto pit = profile_.processes.find(pid);
  if (named_total == 0 || pit == profile_.processes.end()) return;
  ProcessAttribution& p = pit->second;
  std::vector<uint64_t> weights;
  for (const auto& row : named) weights.push_back(row.second);
  const AlgorithmKey unknown_other{classify::Bucket::kOther, classify::algo::kUnknown, classify::Phase::kOther};
  for (size_t phase = 0; phase < kPhaseCount; ++phase) {
    const uint64_t n = group.unknown[phase];
    if (n == 0) continue;
    const auto ph = static_cast<classify::Phase>(phase);
    AlgorithmKey from = unknown_other;
    from.phase = ph;
    Take(p.crypto.algorithms, from, n);
    p.crypto.buckets[static_cast<size_t>(classify::Bucket::kOther)] -= n;
    const std::vector<uint64_t> share = Shares(weights, named_total, n);
    for (size_t i = 0; i < named.size(); ++i) {
      p.crypto.algorithms[{named[i].first.bucket, named[i].first.algorithm, ph}] += share[i];
      p.crypto.buckets[static_cast<size_t>(named[i].first.bucket)] += share[i];
    }
    p.inferred_from_process += n;
  }
  for (const auto& [phase_library, n] : group.unknown_by_library) {
    AlgorithmKey from = unknown_other;
    from.phase = phase_library.first;
    Take(p.crypto.library_algorithms, LibraryAlgorithmKey{from, phase_library.second}, n);
    const std::vector<uint64_t> share = Shares(weights, named_total, n);
    for (size_t i = 0; i < named.size(); ++i) {
      p.crypto.library_algorithms[{{named[i].first.bucket, named[i].first.algorithm, phase_library.first},
                                   phase_library.second}] += share[i];
    }
  }
}

void Attributor::InferFromOperations() {
  // What each process's stacks named, per bucket, before any inference: the
  // fallback for an entry that named nothing itself.
  SeenAlgorithms seen;
  for (const auto& [key, group] : operations_) {
    for (const auto& [alg, n] : group.named) {
      seen[{key.pid, group.bucket, SymbolKey{}, 0}][alg] += n;
      if (key.caller.image != nullptr) seen[{key.pid, group.bucket, key.caller, key.caller_site}][alg] += n;
    }
  }
  for (auto& entry : operations_) {
    // Plain references, not a structured binding: clang 14 (Debian 12) rejects
    // lambdas that capture structured bindings, and the splits below capture group.
    const auto& key = entry.first;
    auto& group = entry.second;
    // Groups are split by what the entry called (AddStack: an unnamed
    // callee's call site, or a named operation entry of the bucket), so a
    // generic entry over stripped code (EVP_EncryptUpdate into the GCM, the
    // ChaCha20 or the generic block-cipher provider) never lends one
    // implementation's name to another.
    const std::map<std::string_view, uint64_t>* from = &group.named;
    uint64_t named_total = 0;
    for (const auto& [alg, n] : *from) named_total += n;
    // An entry that named nothing at all takes, where
    // classify::MayTakeProcessAlgorithm allows (a context's set-up or
    // tear-down, libssl's record protection, an ECDSA/ECDH entry whose curve
    // is in the key, a provider function shared with algorithms that have no
    // report name), the algorithms this process's stacks named elsewhere in
    // its bucket, in proportion; otherwise (EVP_EncryptUpdate into stripped
    // code) it stays `unknown`. A key context (bucket `other`) takes the
    // signature and key-exchange ones. The report counts these samples apart
    // (inferred_from_process) from those the same entry named.
    if (group.bucket == classify::Bucket::kOther) {
      SplitKeyContext(key, group, seen);
      continue;
    }
    // A context's set-up (takes_process_mix) is one entry for every key type
    // and cipher: EVP_PKEY_derive_set_peer serves X25519 and P-256 alike, and
    // only P-256's point check names itself there. Its own named samples
    // would lend that name to the others' set-up, so its unknown samples take
    // the process's mix instead, like an entry that named nothing.
    const bool takes_mix = classify::TakesProcessMix(group.family, group.entry);
    //
    // What the entry's caller named through its other calls of the bucket
    // comes first: the caller chose the algorithm. A caller that makes a
    // fresh AES-GCM context per record and one that reuses a CBC context
    // are told apart, where the process's mix would give the GCM context's
    // set-up (the implicit fetch, the free) to CBC in proportion to CBC's
    // much slower bulk. Only a caller that named nothing of the bucket falls
    // back to the whole process.
    std::map<std::string_view, uint64_t> process_named;
    if (named_total == 0 || takes_mix) {
      uint64_t process_total = 0;
      for (bool caller_only : {true, false}) {
        const auto* mix = Seen(seen, key, group.bucket, caller_only);
        if (mix == nullptr) continue;
        for (const auto& [alg, n] : *mix) {
          if (classify::MayTakeProcessAlgorithm(group.family, group.entry, key.candidate, alg))
            process_named[alg] += n, process_total += n;
        }
        if (process_total > 0) break;
      }
      if (process_total > 0) from = &process_named, named_total = process_total;
    }
    if (named_total == 0) continue;
    const std::map<std::string_view, uint64_t>& named = *from;
    auto pit = profile_.processes.find(key.pid);
    if (pit == profile_.processes.end()) continue;
    uint64_t inferred = 0;
    for (uint64_t n : group.unknown) inferred += n;
    (from == &group.named ? pit->second.inferred_from_operation : pit->second.inferred_from_process) += inferred;
    auto& algorithms = pit->second.crypto.algorithms;
    for (size_t phase = 0; phase < kPhaseCount; ++phase) {
      const uint64_t unknown = group.unknown[phase];
      if (unknown == 0) continue;
      const auto ph = static_cast<classify::Phase>(phase);
      SplitUnknown(algorithms, named, named_total, unknown, [&](std::string_view alg) {
        return AlgorithmKey{group.bucket, alg, ph};
      });
    }
    for (const auto& [phase_library, unknown] : group.unknown_by_library) {
      const classify::Phase ph = phase_library.first;
      const classify::LibraryKind library = phase_library.second;
      SplitUnknown(pit->second.crypto.library_algorithms, named, named_total, unknown, [&](std::string_view alg) {
        return LibraryAlgorithmKey{{group.bucket, alg, ph}, library};
      });
    }
    // The exported stacks carry the inferred algorithm when it is unique.
    if (named.size() == 1) {
      for (size_t index : group.unknown_stacks) profile_.stacks[index].classification.algorithm = named.begin()->first;
    }
  }
}

Attribution Attributor::Finish() {
  InferFromOperations();
  for (const auto& [pid, p] : profile_.processes) profile_.crypto.Merge(p.crypto);
  for (const auto& [pid, counts] : symbols_) {
    std::vector<SymbolRow>& rows = profile_.processes[pid].symbols;
    for (const auto& [key, count] : counts) {
      rows.push_back({.symbol = key.symbol >= 0 ? key.image->image->symbols.at(static_cast<uint32_t>(key.symbol)).name
                                                : std::string("[unnamed]"),
                      .library = key.image->path,
                      .classification = count.classification,
                      .samples = count.samples});
    }
  }
  return std::move(profile_);
}

namespace {

// One 64-bit lane of the stack hash, seeded per lane: each word combined,
// then mixed.
uint64_t MixLane(uint64_t seed, std::span<const uint64_t> words) {
  uint64_t h = seed;
  for (uint64_t w : words) h = Fmix64(h ^ (w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
  return h;
}

}  // namespace

StackCache::Key StackCache::KeyOf(uint32_t tgid, uint64_t generation, std::span<const uint64_t> words) {
  Key key;
  key.tgid = tgid;
  key.generation = generation;
  // The length is hashed too: a stack is not its prefix padded with zeros.
  const uint64_t head[2] = {tgid | static_cast<uint64_t>(words.size()) << 32, generation};
  key.hash[0] = MixLane(MixLane(0x243f6a8885a308d3ULL, head), words);
  key.hash[1] = MixLane(MixLane(0x13198a2e03707344ULL, head), words);
  return key;
}

const Attributor::StackVerdict* StackCache::Find(const Key& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  it->second.last_window = window_;
  return &it->second.verdict;
}

const Attributor::StackVerdict& StackCache::Insert(const Key& key, Attributor::StackVerdict verdict) {
  if (entries_.size() >= kMaxEntries) {
    overflow_ = std::move(verdict);
    return overflow_;
  }
  return entries_.insert_or_assign(key, Entry{std::move(verdict), window_}).first->second.verdict;
}

std::string_view StackCache::Intern(std::string name) { return *names_.insert(std::move(name)).first; }

void StackCache::NextWindow() {
  ++window_;
  std::erase_if(entries_, [&](const auto& e) { return e.second.last_window + kIdleWindows < window_; });
  // Names are few (a library's, an unnamed leaf's address) but never
  // unreferenced one by one: past the bound, start over.
  if (names_.size() > kMaxNames) {
    entries_.clear();
    names_.clear();
  }
}

}  // namespace tlsprof::aggregate
