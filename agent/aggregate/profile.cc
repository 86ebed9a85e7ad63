#include "agent/aggregate/profile.h"

#include <algorithm>

namespace tlsprof::aggregate {

void CryptoTime::Add(const classify::Classification& c, uint64_t count) {
  tls += count;
  buckets[static_cast<size_t>(c.bucket)] += count;
  algorithms[{c.bucket, c.algorithm}] += count;
}

void CryptoTime::Merge(const CryptoTime& other) {
  tls += other.tls;
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
  for (const auto& [key, count] : other.algorithms) algorithms[key] += count;
}

ProcessProfile& Attributor::Process(uint32_t tgid) {
  auto [it, inserted] = profile_.processes.try_emplace(static_cast<pid_t>(tgid));
  ProcessProfile& p = it->second;
  if (inserted) {
    p.pid = static_cast<pid_t>(tgid);
    if (const auto* snap = registry_.Get(p.pid)) {
      p.comm = snap->comm;
      for (const auto& m : snap->mappings) {
        if (!m.image || !m.image->tls) continue;
        bool seen = std::any_of(p.libraries.begin(), p.libraries.end(),
                                [&](const LibraryUse& u) { return u.image == m.image.get(); });
        if (!seen) p.libraries.push_back({m.image.get(), 0, 0});
      }
    }
  }
  return p;
}

void Attributor::AddProcess(uint32_t tgid, uint64_t user_samples, uint64_t kernel_samples) {
  ProcessProfile& p = Process(tgid);
  p.samples += user_samples + kernel_samples;
  p.kernel_samples += kernel_samples;
}

std::optional<classify::Classification> Attributor::Classify(const discovery::ProcessSnapshot& process, uint64_t ip,
                                                             SymbolKey* where) {
  *where = SymbolKey{};
  const auto* m = process.Find(ip);
  if (m == nullptr || !m->image || !m->image->tls || !m->image->image) return std::nullopt;
  const discovery::ImageInfo& info = *m->image;
  where->image = &info;
  const symbols::BinaryImage& img = *info.image;

  std::optional<classify::Classification> c;
  auto vaddr = img.FileOffsetToVaddr(ip - m->mapping.start + m->mapping.offset);
  auto index = vaddr ? img.symbols.Find(*vaddr) : std::nullopt;
  if (index) {
    where->symbol = *index;
    auto key = std::make_pair(&img, *index);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      it =
          cache_.emplace(key, classify::ClassifySymbol(classify::FamilyOf(info.tls->kind), img.symbols.at(*index).name))
              .first;
    }
    c = it->second;
  }
  if (info.tls->whole_file_is_tls && !c) c = classify::Classification{};  // {other, unknown}
  return c;
}

void Attributor::AddUserSamples(uint32_t tgid, uint64_t ip, uint64_t count) {
  const auto* snap = registry_.Get(static_cast<pid_t>(tgid));
  if (snap == nullptr) {
    profile_.unresolved_samples += count;
    return;
  }
  SymbolKey where;
  auto c = Classify(*snap, ip, &where);
  if (!c) return;
  ProcessProfile& p = Process(tgid);
  p.crypto.Add(*c, count);
  SymbolCount& sym = p.symbols[where];
  sym.classification = *c;
  sym.samples += count;
  for (LibraryUse& u : p.libraries) {
    if (u.image != where.image) continue;
    u.tls_samples += count;
    if (where.symbol >= 0) u.named_samples += count;
  }
}

Profile Attributor::Finish() {
  for (const auto& [pid, p] : profile_.processes) profile_.crypto.Merge(p.crypto);
  return std::move(profile_);
}

}  // namespace tlsprof::aggregate
