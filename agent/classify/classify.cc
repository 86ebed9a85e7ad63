// The engine that walks the rules table (rules.cc). No rule lives here.
#include "agent/classify/classify.h"

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/classify/rules.h"

namespace tlsprof::classify {
namespace {

using rules::FamilyMask;

constexpr bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
constexpr bool Contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }
constexpr bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A symbol name split for matching.
//   C names: gate = the name less compiler/linker suffixes (.constprop.0,
//     .cold, @@OPENSSL_3.0.0); leaf = gate less leading '_' (perlasm's
//     _aesni_ctr32_ghash_6x and __ecp_nistz256_mul_montq match rules as
//     aesni_... and ecp_nistz256_...).
//   C++ names: ns = outermost namespace ("" at global scope), leaf = innermost
//     function name. Only internal-linkage globals (_ZL..., C-style statics of
//     BoringSSL's .cc files) are gated like C names; other global-scope C++
//     functions are never TLS (gate empty).
struct CName {
  std::string_view ns;
  std::string_view gate;
  std::string_view leaf;
  bool cxx = false;
};

// Reads <length><identifier> at pos of a mangled name.
bool ReadSourceName(std::string_view m, size_t& pos, std::string_view& out) {
  size_t n = 0;
  size_t p = pos;
  if (p >= m.size() || !IsDigit(m[p])) return false;
  while (p < m.size() && IsDigit(m[p])) n = n * 10 + static_cast<size_t>(m[p++] - '0');
  if (n == 0 || p + n > m.size()) return false;
  out = m.substr(p, n);
  pos = p + n;
  return true;
}

// Itanium-mangled names, just enough for functions: _Z[L]<name>... and
// _ZN[qualifiers](<name>)+E... (anonymous namespaces skipped). Anything
// fancier (local entities, operators, ctors) yields an empty leaf.
CName SplitMangled(std::string_view m) {
  CName out;
  out.cxx = true;
  size_t pos = 2;  // past "_Z"
  if (pos < m.size() && m[pos] == 'N') {
    ++pos;
    while (pos < m.size() && (m[pos] == 'r' || m[pos] == 'V' || m[pos] == 'K' || m[pos] == 'R' || m[pos] == 'O')) ++pos;
    int components = 0;
    while (pos < m.size()) {
      if (m.substr(pos, 2) == "St") {  // std::
        out.ns = "std";
        ++components;
        pos += 2;
        continue;
      }
      if (m[pos] == 'L') ++pos;  // internal linkage marker inside a nested name
      std::string_view id;
      if (!ReadSourceName(m, pos, id)) break;
      if (id == "_GLOBAL__N_1") continue;  // anonymous namespace
      if (components++ == 0) out.ns = id;
      out.leaf = id;
    }
    // One component: a global-scope name inside an anonymous namespace,
    // internal linkage like a C static.
    if (components <= 1) {
      out.ns = {};
      out.gate = out.leaf;
    }
    return out;
  }
  const bool internal = pos < m.size() && m[pos] == 'L';
  if (internal) ++pos;
  std::string_view id;
  if (ReadSourceName(m, pos, id)) {
    out.leaf = id;
    if (internal) out.gate = id;
  }
  return out;
}

// Cuts a demangled or C name at its argument list, skipping the '(' of
// "(anonymous namespace)".
std::string_view CutArgs(std::string_view s) {
  size_t from = 0;
  while (true) {
    size_t p = s.find('(', from);
    if (p == std::string_view::npos) return s;
    if (s.substr(p, 21) == "(anonymous namespace)") {
      from = p + 21;
      continue;
    }
    return s.substr(0, p);
  }
}

CName SplitCName(std::string_view name) {
  if (StartsWith(name, "_Z")) return SplitMangled(name);
  if (Contains(name, "::")) {  // demangled C++
    CName out;
    out.cxx = true;
    std::string_view q = CutArgs(name);
    size_t first = q.find("::");
    out.ns = q.substr(0, first);
    size_t last = q.rfind("::");
    out.leaf = q.substr(last + 2);
    if (StartsWith(out.ns, "(anonymous")) {
      out.ns = {};
      out.gate = out.leaf;
    }
    return out;
  }
  CName out;
  out.gate = name.substr(0, name.find_first_of(".@("));
  std::string_view s = out.gate;
  while (!s.empty() && s.front() == '_') s.remove_prefix(1);
  out.leaf = s;
  return out;
}

std::string_view GoName(std::string_view name) {
  if (StartsWith(name, "vendor/")) name.remove_prefix(7);
  return name;
}

// First-character index over the library prefixes: IsTlsSymbol runs over
// every symbol of 100 MB binaries, so the gate must not scan the whole list.
struct PrefixIndex {
  std::array<std::vector<rules::LibraryPrefix>, 256> by_first;
  PrefixIndex() {
    for (const auto& p : rules::LibraryPrefixes()) by_first[static_cast<unsigned char>(p.prefix.front())].push_back(p);
  }
  bool Matches(FamilyMask mask, std::string_view name) const {
    if (name.empty()) return false;
    for (const auto& p : by_first[static_cast<unsigned char>(name.front())]) {
      if ((p.families & mask) && (p.exact ? name == p.prefix : StartsWith(name, p.prefix))) return true;
    }
    return false;
  }
};

const PrefixIndex& Index() {
  static const PrefixIndex index;  // thread-safe initialisation (C++11 magic statics)
  return index;
}

bool IsTlsNamespace(FamilyMask mask, std::string_view ns) {
  for (const auto& n : rules::CxxNamespaces()) {
    if ((n.families & mask) && n.ns == ns) return true;
  }
  return false;
}

bool RuleMatches(const rules::Rule& r, std::string_view s) {
  return rules::PatternMatches(r.match, r.pattern, s) && (r.and_contains.empty() || Contains(s, r.and_contains));
}

std::optional<Classification> ApplyRules(FamilyMask mask, std::string_view s) {
  if (s.empty()) return std::nullopt;
  for (const auto& r : rules::Rules()) {
    if ((r.families & mask) && RuleMatches(r, s)) return Classification{r.bucket, r.algorithm};
  }
  return std::nullopt;
}

// Whether a split C/C++ name is library code of the families in `mask`.
bool IsLibraryCName(FamilyMask mask, const CName& c) {
  if (c.cxx && !c.ns.empty()) return IsTlsNamespace(mask, c.ns);
  return Index().Matches(mask, c.gate);
}

// ---- OpenSSL 3 provider-table names (rules.h, ProviderOperation)

// An algorithm of the report's vocabulary (not unknown, not "ECDSA of any curve").
bool IsConcrete(std::string_view a) {
  return a != algo::kUnknown && a != rules::kAnyEcdsa && a != rules::kAnyEcdh && a != rules::kAnyAes;
}

constexpr std::string_view kProviderPrefix = "provider:";

// The parts of a name the library-table readers give a function:
// "<prefix><kind>:<algorithm>[|<algorithm>...]:<role>" (provider:...,
// agent/symbols/library_tables.h; boringssl:..., boringssl_tables.h).
struct TableName {
  std::string_view kind, algorithms, role;
};
// nullopt if `name` lacks `prefix`; a TableName with an empty kind if it has
// the prefix but not the shape.
std::optional<TableName> SplitTableName(std::string_view name, std::string_view prefix) {
  if (!StartsWith(name, prefix)) return std::nullopt;
  const std::string_view rest = name.substr(prefix.size());
  const size_t kind_end = rest.find(':');
  const size_t role_start = rest.rfind(':');  // algorithm names have no ':'
  if (kind_end == std::string_view::npos || role_start == kind_end) return TableName{};
  return TableName{rest.substr(0, kind_end), rest.substr(kind_end + 1, role_start - kind_end - 1),
                   rest.substr(role_start + 1)};
}

// What a function the table shares between the '|'-listed algorithms names:
// `lookup(listed)` gives one's {bucket, algorithm}, algorithm "" where the
// table has no report name for it. Same bucket for all, else nullopt; the
// algorithm only if every listed one maps to it (so AES-GCM|ARIA-GCM names
// none), else "".
template <typename Lookup>
std::optional<std::pair<Bucket, std::string_view>> Common(std::string_view algorithms, Lookup lookup) {
  size_t bar = algorithms.find('|');
  const auto first = lookup(algorithms.substr(0, bar));
  std::string_view common = first.second;
  while (bar != std::string_view::npos) {
    const size_t next = algorithms.find('|', bar + 1);
    const auto other = lookup(algorithms.substr(bar + 1, next == std::string_view::npos ? next : next - bar - 1));
    if (other.first != first.first) return std::nullopt;
    if (other.second != common) common = {};
    bar = next;
  }
  return std::pair{first.first, common};
}

// One listed algorithm of a table entry of `kind`: its bucket and algorithm
// from `table`, {`bucket`, ""} if the table does not list it.
std::pair<Bucket, std::string_view> TableAlgorithmOf(std::span<const rules::TableAlgorithm> table,
                                                     std::string_view kind, Bucket bucket, std::string_view name) {
  for (const auto& row : table) {
    if (row.kind == kind && row.name == name) return {row.bucket, row.algorithm};
  }
  return {bucket, std::string_view()};
}

// The same for a provider operation (rules::ProviderAlgorithms()).
std::pair<Bucket, std::string_view> ProviderAlgorithm(std::string_view operation, Bucket bucket,
                                                      std::string_view name) {
  return TableAlgorithmOf(rules::ProviderAlgorithms(), operation, bucket, name);
}

struct ProviderHit {
  Bucket bucket = Bucket::kOther;
  std::string_view algorithm = algo::kUnknown;  // may be kAnyEcdsa/kAnyEcdh
  bool entry = false;                           // an operation entry
  bool takes_process_mix = false;               // rules::Operation::takes_process_mix
};

// Whether a provider function's role(s), '+'-joined, all set a context up or
// tear it down: newctx, freectx, dupctx, reset, set_peer, the *init and the
// *params calls.
bool IsLifecycleRole(std::string_view roles) {
  while (!roles.empty()) {
    const size_t plus = roles.find('+');
    const std::string_view role = roles.substr(0, plus);
    const bool lifecycle = role == "newctx" || role == "freectx" || role == "dupctx" || role == "reset" ||
                           role == "set_peer" || role.ends_with("init") || role.ends_with("params");
    if (!lifecycle) return false;
    roles = plus == std::string_view::npos ? std::string_view() : roles.substr(plus + 1);
  }
  return true;
}

// "provider:<operation>:<algorithm>[|<algorithm>...]:<role>"
// (agent/symbols/library_tables.h); nullopt if `leaf` is not one.
std::optional<ProviderHit> ClassifyProviderName(std::string_view leaf) {
  const std::optional<TableName> name = SplitTableName(leaf, kProviderPrefix);
  if (!name || name->kind.empty()) return name ? std::optional(ProviderHit{}) : std::nullopt;
  const rules::ProviderOperation* op = nullptr;
  for (const auto& row : rules::ProviderOperations()) {
    if (row.operation == name->kind) {
      op = &row;
      break;
    }
  }
  if (op == nullptr || !StartsWith(name->role, op->entry_roles)) return ProviderHit{};
  const bool takes_mix = IsLifecycleRole(name->role);
  const auto common = Common(
      name->algorithms, [&](std::string_view listed) { return ProviderAlgorithm(name->kind, op->bucket, listed); });
  if (!common) return ProviderHit{op->bucket, algo::kUnknown, true, takes_mix};
  return ProviderHit{common->first, common->second.empty() ? algo::kUnknown : common->second, true, takes_mix};
}

// ---- Method-table names (rules.h, BoringTableKind and OpenSslTableKinds)

constexpr std::string_view kBoringTablePrefix = "boringssl:";
constexpr std::string_view kOpenSslTablePrefix = "openssl:";

// "<prefix><kind>:<algorithm>[|<algorithm>...]:<role>", read with `kinds`
// and `table`: BoringSSL's method structs ("boringssl:",
// agent/symbols/boringssl_tables.h) and the code tables below OpenSSL 3's
// providers ("openssl:", agent/symbols/library_tables.h). nullopt if `leaf`
// is not one.
std::optional<Classification> ClassifyMethodTableName(std::string_view leaf, std::string_view prefix,
                                                      std::span<const rules::BoringTableKind> kinds,
                                                      std::span<const rules::TableAlgorithm> table) {
  const std::optional<TableName> name = SplitTableName(leaf, prefix);
  if (!name || name->kind.empty()) return name ? std::optional(Classification{}) : std::nullopt;
  const rules::BoringTableKind* k = nullptr;
  for (const auto& row : kinds) {
    if (row.kind == name->kind) {
      k = &row;
      break;
    }
  }
  if (k == nullptr) return Classification{};
  // Named only if every listed algorithm maps to the same one (so
  // P-224|P-256|P-384|P-521, the generic Montgomery code, names no curve).
  const auto common = Common(name->algorithms, [k, table](std::string_view listed) {
    return TableAlgorithmOf(table, k->kind, k->bucket, listed);
  });
  if (!common) return Classification{k->bucket, algo::kUnknown};
  return Classification{common->first, common->second.empty() ? algo::kUnknown : common->second};
}

std::optional<Classification> ClassifyC(FamilyMask mask, std::string_view name) {
  const CName c = SplitCName(name);
  if (!IsLibraryCName(mask, c)) return std::nullopt;
  if (mask & rules::kO) {
    if (auto hit = ClassifyProviderName(c.leaf)) {
      return Classification{hit->bucket, IsConcrete(hit->algorithm) ? hit->algorithm : algo::kUnknown};
    }
  }
  if (mask & rules::kO) {
    if (auto hit = ClassifyMethodTableName(c.leaf, kOpenSslTablePrefix, rules::OpenSslTableKinds(),
                                           rules::OpenSslTableAlgorithms())) {
      return hit;
    }
  }
  if (mask & rules::kB) {
    if (auto hit = ClassifyMethodTableName(c.leaf, kBoringTablePrefix, rules::BoringTableKinds(),
                                           rules::BoringTableAlgorithms())) {
      return hit;
    }
  }
  if (auto hit = ApplyRules(mask, c.leaf)) return hit;
  // mlkem::(anonymous namespace)::scalar_ntt: the namespace names the algorithm.
  if (c.cxx && !c.ns.empty()) {
    if (auto hit = ApplyRules(mask, c.ns)) return hit;
  }
  return Classification{};
}

std::optional<Classification> ClassifyGo(std::string_view name) {
  std::string_view g = GoName(name);
  if (StartsWith(g, "_goboringcrypto_")) {
    // BoringSSL statically linked into a Go binary: its symbols carry this
    // prefix; the rest is an ordinary BoringSSL name.
    if (auto hit = ApplyRules(rules::kB, SplitCName(g.substr(16)).leaf)) return hit;
    return Classification{};
  }
  if (!Index().Matches(rules::kG, g)) return std::nullopt;
  if (auto hit = ApplyRules(rules::kG, g)) return hit;
  return Classification{};
}

// ---- Operation and phase tables (operations.cc)

// A frame's name prepared once for the operation and phase tables. For C++
// names outside a TLS namespace `leaf` is empty: nothing matches.
struct EntryName {
  std::string_view leaf;  // C: suffix-less, leading '_' dropped; C++: innermost name; Go: whole
  std::string_view full;  // kContains rows (C++ class names live here)
  FamilyMask mask = 0;
};

EntryName PrepareEntryName(Family family, std::string_view name) {
  EntryName e;
  e.mask = rules::MaskOf(family);
  if (family == Family::kGo) {
    std::string_view g = GoName(name);
    if (StartsWith(g, "_goboringcrypto_")) {  // BoringSSL linked into Go
      e.mask = rules::kB;
      e.leaf = SplitCName(g.substr(16)).leaf;
      e.full = g;
      return e;
    }
    e.leaf = g;
    e.full = g;
    return e;
  }
  const CName c = SplitCName(name);
  if (c.cxx && !c.ns.empty() && !IsTlsNamespace(e.mask, c.ns)) return e;
  e.leaf = c.leaf;
  e.full = name;
  return e;
}

template <typename Row>
bool EntryMatches(const Row& r, const EntryName& e) {
  if (!(r.families & e.mask) || e.leaf.empty()) return false;
  // kExact/kPrefix rows see the innermost name, kContains rows the whole one.
  return rules::PatternMatches(r.match, r.pattern, r.match == rules::Match::kContains ? e.full : e.leaf);
}

// What an operation entry says (a row of rules::Operations(), or a provider
// function's table name).
struct OperationHit {
  Bucket bucket = Bucket::kOther;
  std::string_view algorithm = algo::kUnknown;  // may be kAnyEcdsa/kAnyEcdh
  bool container = false;
  bool takes_process_mix = false;
};

std::optional<OperationHit> FindOperation(const EntryName& e) {
  if (e.leaf.empty()) return std::nullopt;
  if (e.mask & rules::kO) {
    if (auto hit = ClassifyProviderName(e.leaf)) {
      if (!hit->entry) return std::nullopt;
      return OperationHit{hit->bucket, hit->algorithm, false, hit->takes_process_mix};
    }
  }
  for (const auto& r : rules::Operations()) {
    if (EntryMatches(r, e)) return OperationHit{r.bucket, r.algorithm, r.container, r.takes_process_mix};
  }
  return std::nullopt;
}

std::optional<Phase> FindPhase(const EntryName& e) {
  if (e.leaf.empty()) return std::nullopt;
  for (const auto& r : rules::PhaseEntries()) {
    if (EntryMatches(r, e)) return r.phase;
  }
  return std::nullopt;
}

std::optional<Classification> ClassifySymbolOnce(Family family, std::string_view name) {
  if (family == Family::kGo) return ClassifyGo(name);
  return ClassifyC(rules::MaskOf(family), name);
}

// What the tables say of one frame name. The tables are searched row by row
// (a string comparison each), and a server's frames repeat across its stacks
// and windows: each (family, name) is looked up once per thread, and kept
// (names copied; a few MB at most) until kMaxNames names are, then the memo
// starts over.
struct NameFacts {
  std::optional<OperationHit> operation;
  std::optional<Phase> phase;
  std::optional<Classification> symbol;  // ClassifySymbol
  std::string_view other_part;           // the first kOtherParts row's part, or empty
};

NameFacts FactsOf(Family family, std::string_view name) {
  static constexpr size_t kMaxNames = 16384;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  using Memo = std::unordered_map<std::string, NameFacts, Hash, std::equal_to<>>;
  thread_local std::array<Memo, 3> memo;  // by Family
  Memo& m = memo[static_cast<size_t>(family) % memo.size()];
  if (auto it = m.find(name); it != m.end()) return it->second;
  if (m.size() >= kMaxNames) m.clear();
  NameFacts facts;
  const EntryName e = PrepareEntryName(family, name);
  facts.operation = FindOperation(e);
  facts.phase = FindPhase(e);
  facts.symbol = ClassifySymbolOnce(family, name);
  if (!e.leaf.empty()) {
    for (const auto& r : rules::OtherParts()) {
      if (EntryMatches(r, e)) {
        facts.other_part = r.part;
        break;
      }
    }
  }
  m.emplace(std::string(name), facts);
  return facts;
}

std::optional<OperationHit> OperationOf(Family family, std::string_view name) {
  return FactsOf(family, name).operation;
}

// The part of `other` for a stack with no crypto operation (operations.cc,
// kOtherParts): x509 anywhere, else rng anywhere, else library anywhere, else
// the phase's part, else unknown.
std::string_view OtherPartOf(std::span<const FrameInfo> frames, Phase phase) {
  bool rng = false, library = false;
  for (const FrameInfo& f : frames) {
    if (!f.tls || f.name.empty()) continue;
    const std::string_view part = FactsOf(f.family, f.name).other_part;
    if (part == algo::kOtherX509) return algo::kOtherX509;
    rng = rng || part == algo::kOtherRng;
    library = library || part == algo::kOtherLibrary;
  }
  if (rng) return algo::kOtherRng;
  if (library) return algo::kOtherLibrary;
  if (phase == Phase::kHandshake) return algo::kOtherHandshake;
  if (phase == Phase::kRecord) return algo::kOtherRecord;
  return algo::kUnknown;
}

bool IsAmbiguousCurve(std::string_view a) { return a == algo::kP256Ambiguous || a == algo::kP384Ambiguous; }

// The shared P-256/P-384 code, once the operation says which one it serves.
std::string_view ResolveCurve(std::string_view a, Bucket bucket) {
  if (a == algo::kP256Ambiguous) return bucket == Bucket::kKeyExchange ? algo::kEcdheP256 : algo::kEcdsaP256;
  if (a == algo::kP384Ambiguous) return bucket == Bucket::kKeyExchange ? algo::kEcdheP384 : algo::kEcdsaP384;
  return a;
}

// Whether `inner` is a building block of `outer` (rules::PartsOf).
bool IsPartOf(std::string_view inner, std::string_view outer) {
  for (const auto& p : rules::PartsOf()) {
    if (p.part == inner && p.whole == outer) return true;
  }
  return false;
}

// May a primitive labelled `a` name the algorithm of an operation of `bucket`
// whose innermost constraining entry says `constraint`?
bool Compatible(Bucket prim_bucket, std::string_view a, Bucket bucket, std::string_view constraint) {
  if (a == algo::kUnknown) return false;
  const bool curve = IsAmbiguousCurve(a);
  if (curve) {
    if (bucket != Bucket::kSignature && bucket != Bucket::kKeyExchange) return false;
  } else if (prim_bucket != bucket) {
    return false;
  }
  const std::string_view resolved = ResolveCurve(a, bucket);
  if (constraint == algo::kUnknown) return true;
  if (constraint == rules::kAnyEcdsa) return resolved == algo::kEcdsaP256 || resolved == algo::kEcdsaP384;
  if (constraint == rules::kAnyEcdh) return resolved == algo::kEcdheP256 || resolved == algo::kEcdheP384;
  if (constraint == rules::kAnyAes) return resolved.starts_with("AES-");
  return resolved == constraint;
}

}  // namespace

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kHandshake:
      return "handshake";
    case Phase::kRecord:
      return "record";
    case Phase::kOther:
      return "other";
  }
  return "other";
}

std::optional<Classification> ClassifyOperation(Family family, std::string_view name) {
  const std::optional<OperationHit> op = OperationOf(family, name);
  if (!op) return std::nullopt;
  return Classification{op->bucket, IsConcrete(op->algorithm) ? op->algorithm : algo::kUnknown};
}

bool IsSpecificOperation(Family family, std::string_view name) {
  const std::optional<OperationHit> op = OperationOf(family, name);
  return op && op->algorithm != algo::kUnknown;
}

bool TakesProcessMix(Family family, std::string_view entry) {
  const std::optional<OperationHit> op = OperationOf(family, entry);
  return op && op->takes_process_mix;
}

bool IsKeyContext(Family family, std::string_view entry) {
  const std::optional<OperationHit> op = OperationOf(family, entry);
  return op && op->bucket == Bucket::kOther && op->takes_process_mix;
}

std::string_view SoleNamedCandidate(Family family, std::string_view name) {
  if (family != Family::kOpenSSL) return {};
  const std::optional<TableName> table = SplitTableName(name, kProviderPrefix);
  if (!table || table->kind.empty() || table->algorithms.find('|') == std::string_view::npos) return {};
  // The listed algorithms with a report name, "" standing for those without.
  std::string_view sole;
  const auto common = Common(table->algorithms, [&](std::string_view listed) {
    const auto hit = ProviderAlgorithm(table->kind, Bucket::kOther, listed);
    if (IsConcrete(hit.second)) {
      if (!sole.empty() && sole != hit.second) sole = "|";  // two different ones: none
      if (sole.empty()) sole = hit.second;
    }
    return std::pair{Bucket::kOther, std::string_view()};
  });
  return common && sole != "|" ? sole : std::string_view();
}

bool MayTakeProcessAlgorithm(Family family, std::string_view entry, std::string_view candidate,
                             std::string_view algorithm) {
  if (algorithm == algo::kUnknown) return false;
  if (!candidate.empty()) return algorithm == candidate;
  const std::optional<OperationHit> op = OperationOf(family, entry);
  if (!op) return false;
  if (op->algorithm == algo::kUnknown) return op->takes_process_mix;
  if (op->algorithm == rules::kAnyEcdsa) return algorithm.starts_with("ECDSA-");
  if (op->algorithm == rules::kAnyEcdh) return algorithm.starts_with("ECDHE-");
  if (op->algorithm == rules::kAnyAes) return algorithm.starts_with("AES-");
  return op->algorithm == algorithm;
}

std::optional<Phase> ClassifyPhaseEntry(Family family, std::string_view name) { return FactsOf(family, name).phase; }

StackClassification ClassifyStack(std::span<const FrameInfo> frames) {
  StackClassification out;
  // Pass 1, leaf to root: TLS at all, the outermost operation (a container
  // only if no other operation is on the stack), the phase.
  std::optional<OperationHit> op;
  size_t op_index = 0;
  std::optional<OperationHit> container;
  size_t container_index = 0;
  bool handshake = false;
  bool record = false;
  for (size_t i = 0; i < frames.size(); ++i) {
    const FrameInfo& f = frames[i];
    if (!f.tls) continue;
    out.tls = true;
    if (f.name.empty()) continue;
    const NameFacts facts = FactsOf(f.family, f.name);
    if (const std::optional<OperationHit>& o = facts.operation) {
      if (o->container) {
        container = o;
        container_index = i;
      } else {
        op = o;
        op_index = i;
      }
    }
    if (!handshake) {
      if (const std::optional<Phase>& p = facts.phase) {
        handshake = *p == Phase::kHandshake;
        record = record || *p == Phase::kRecord;
      }
    }
  }
  if (!out.tls) return out;
  out.phase = handshake ? Phase::kHandshake : record ? Phase::kRecord : Phase::kOther;
  if (!op && container) {
    op = container;
    op_index = container_index;
  }

  if (!op) {
    // No operation: the innermost primitive decides, as leaf-only did.
    for (const FrameInfo& f : frames) {
      if (!f.tls || f.name.empty()) continue;
      auto c = ClassifySymbol(f.family, f.name);
      if (c && c->bucket != Bucket::kOther) {
        out.classification = *c;
        return out;
      }
    }
    out.classification.algorithm = OtherPartOf(frames, out.phase);
    return out;
  }

  // Pass 2, from the outermost operation down to the leaf: the innermost
  // primitive that fits the operation (same bucket, named algorithm, allowed
  // by the innermost same-bucket operation above it), else the innermost
  // same-bucket operation that names an algorithm.
  const Bucket bucket = op->bucket;
  std::string_view constraint = op->algorithm;
  std::string_view from_op = IsConcrete(op->algorithm) ? op->algorithm : algo::kUnknown;
  std::string_view from_primitive;
  for (size_t i = op_index + 1; i-- > 0;) {
    const FrameInfo& f = frames[i];
    if (!f.tls || f.name.empty()) continue;
    if (i != op_index) {
      const std::optional<OperationHit> o = OperationOf(f.family, f.name);
      if (o && o->bucket == bucket && o->algorithm != algo::kUnknown) {
        constraint = o->algorithm;
        if (IsConcrete(o->algorithm)) from_op = o->algorithm;
      }
    }
    auto c = ClassifySymbol(f.family, f.name);
    if (c && Compatible(c->bucket, c->algorithm, bucket, constraint) && !IsPartOf(c->algorithm, from_primitive)) {
      from_primitive = ResolveCurve(c->algorithm, bucket);
    }
  }
  out.classification.bucket = bucket;
  out.classification.algorithm = !from_primitive.empty() ? from_primitive : from_op;
  return out;
}

std::string_view BucketName(Bucket bucket) {
  switch (bucket) {
    case Bucket::kCipher:
      return "cipher";
    case Bucket::kSignature:
      return "signature";
    case Bucket::kKeyExchange:
      return "key_exchange";
    case Bucket::kHash:
      return "hash";
    case Bucket::kOther:
      return "other";
  }
  return "other";
}

std::string_view FamilyName(Family family) {
  switch (family) {
    case Family::kOpenSSL:
      return "openssl";
    case Family::kBoringSSL:
      return "boringssl";
    case Family::kGo:
      return "go";
  }
  return "openssl";
}

std::string_view LibraryKindName(LibraryKind kind) {
  switch (kind) {
    case LibraryKind::kOpenSSL11:
      return "openssl-1.1";
    case LibraryKind::kOpenSSL3:
      return "openssl-3";
    case LibraryKind::kBoringSSL:
      return "boringssl";
    case LibraryKind::kGo:
      return "go";
  }
  return "openssl-3";
}

Family FamilyOf(LibraryKind kind) {
  switch (kind) {
    case LibraryKind::kOpenSSL11:
    case LibraryKind::kOpenSSL3:
      return Family::kOpenSSL;
    case LibraryKind::kBoringSSL:
      return Family::kBoringSSL;
    case LibraryKind::kGo:
      return Family::kGo;
  }
  return Family::kOpenSSL;
}

std::optional<Classification> ClassifySymbol(Family family, std::string_view name) {
  return FactsOf(family, name).symbol;
}

bool IsTlsSymbol(std::string_view name) {
  if (name.empty()) return false;
  // Go names always contain '/' or '.' in a package path; checking the Go gate
  // first is one indexed lookup.
  std::string_view g = GoName(name);
  if (Index().Matches(rules::kG, g)) return true;
  return IsLibraryCName(rules::kO | rules::kB, SplitCName(name));
}

namespace {

// Markers: functions only one library (or version) defines. Checked in this
// order; BoringSSL first because it also defines OPENSSL_init_crypto and
// OPENSSL_init_ssl (as no-ops) for OpenSSL compatibility.
constexpr std::string_view kBoringSslMarkers[] = {
    "BORINGSSL_self_test",                // libcrypto (android build exports it)
    "CRYPTO_is_confidential_build",       // libcrypto
    "EVP_AEAD_CTX_seal",                  // libcrypto (EVP_AEAD is BoringSSL's API)
    "SSL_CTX_set_select_certificate_cb",  // libssl
    "SSL_CTX_set_strict_cipher_list",     // libssl
    "SSL_get_curve_id",                   // libssl
};
constexpr std::string_view kOpenSsl3Markers[] = {
    "OSSL_PROVIDER_load",        // libcrypto 3.x
    "EVP_MAC_fetch",             // libcrypto 3.x
    "OSSL_LIB_CTX_new",          // libcrypto 3.x
    "SSL_CTX_new_ex",            // libssl 3.x
    "OSSL_default_cipher_list",  // libssl 3.x
};
constexpr std::string_view kOpenSsl11Markers[] = {
    "OPENSSL_init_ssl",     // libssl >= 1.1.0
    "OPENSSL_init_crypto",  // libcrypto >= 1.1.0
};
// A Go binary's crypto/* is its TLS library, as libcrypto is OpenSSL's,
// whether or not crypto/tls is linked (a JWT signer, a key server): any
// function of these packages marks it. crypto/tls's own functions are under
// "crypto/" too. math/big alone (a calculator) is not crypto.
constexpr std::string_view kGoCryptoPrefixes[] = {
    "crypto/",
    "vendor/golang.org/x/crypto/",  // the std's vendored copy (chacha20poly1305, curve25519, hkdf)
    "golang.org/x/crypto/",         // a module's own copy
    "_goboringcrypto_",             // GOEXPERIMENT=boringcrypto
};

bool AnyDefined(const std::function<bool(std::string_view)>& has_symbol, std::span<const std::string_view> names) {
  for (auto n : names) {
    if (has_symbol(n)) return true;
  }
  return false;
}

std::string_view BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Versioned file names, for libraries whose symbols we cannot read (e.g. a
// library with an empty or unreadable .dynsym).
std::optional<LibraryKind> KindFromFileName(std::string_view file) {
  std::string_view base = BaseName(file);
  std::string_view rest;
  if (StartsWith(base, "libcrypto.so")) {
    rest = base.substr(12);
  } else if (StartsWith(base, "libssl.so")) {
    rest = base.substr(9);
  } else {
    return std::nullopt;
  }
  if (StartsWith(rest, ".3")) return LibraryKind::kOpenSSL3;
  if (StartsWith(rest, ".1.1")) return LibraryKind::kOpenSSL11;
  // Debian's android-libboringssl ships libcrypto.so.0/libssl.so.0 (OpenSSL
  // 0.9.8 was libcrypto.so.0.9.8, never plain .0).
  if (rest == ".0") return LibraryKind::kBoringSSL;
  if (Contains(file, "/android/")) return LibraryKind::kBoringSSL;
  // libcrypto.so.1.0.x and other versions: closest rules are OpenSSL 1.1's.
  return LibraryKind::kOpenSSL11;
}

}  // namespace

std::optional<LibraryKind> DetectLibrary(const std::function<bool(std::string_view)>& has_symbol,
                                         std::string_view soname, std::string_view file_name, bool is_go,
                                         const std::function<bool(std::string_view)>& has_symbol_prefix) {
  if (is_go && has_symbol_prefix) {
    for (std::string_view prefix : kGoCryptoPrefixes) {
      if (has_symbol_prefix(prefix)) return LibraryKind::kGo;
    }
    // A Go program without crypto/* may still link C TLS libraries via cgo;
    // fall through to the C checks.
  }
  if (AnyDefined(has_symbol, kBoringSslMarkers)) return LibraryKind::kBoringSSL;
  if (AnyDefined(has_symbol, kOpenSsl3Markers)) return LibraryKind::kOpenSSL3;
  if (AnyDefined(has_symbol, kOpenSsl11Markers)) return LibraryKind::kOpenSSL11;
  if (auto k = KindFromFileName(soname)) return k;
  if (auto k = KindFromFileName(file_name)) return k;
  return std::nullopt;
}

}  // namespace tlsprof::classify
