#include "agent/symbols/object_layout.h"

#include <algorithm>
#include <set>
#include <unordered_set>
#include <utility>

namespace tlsprof::symbols {
namespace {

// GCC names a function's split-off unlikely part `foo.cold` (`foo.cold.12`
// before GCC 10) and places it in .text.unlikely with other objects' parts.
constexpr std::string_view kColdSuffix = ".cold";

bool IsColdPart(std::string_view name) { return name.find(kColdSuffix) != std::string_view::npos; }

}  // namespace

void SelectWholeObjects(std::vector<LinkedFunction>& functions) {
  // The main text in address order; cold parts are set aside (rule 1).
  std::vector<size_t> order;
  order.reserve(functions.size());
  for (size_t i = 0; i < functions.size(); ++i) {
    if (!IsColdPart(functions[i].name)) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return functions[a].addr < functions[b].addr; });
  auto at = [&](size_t k) -> LinkedFunction& { return functions[order[k]]; };
  const size_t n = order.size();

  // Rule 2: segments of one object's locals, with the globals between them.
  std::vector<size_t> locals;
  for (size_t k = 0; k < n; ++k) {
    if (at(k).object >= 0) locals.push_back(k);
  }
  for (size_t a = 0; a < locals.size();) {
    size_t b = a;
    while (b + 1 < locals.size() && at(locals[b + 1]).object == at(locals[a]).object) ++b;
    const size_t first = locals[a], last = locals[b];
    bool any = false;
    for (size_t k = first; k <= last && !any; ++k) any = at(k).selected;
    if (any) {
      for (size_t k = first; k <= last; ++k) at(k).selected = true;
    }
    a = b + 1;
  }

  // Rule 3: runs between selected functions whose locals are one object's.
  for (size_t k = 0; k < n;) {
    if (at(k).selected) {
      ++k;
      continue;
    }
    size_t end = k;
    int32_t object = -1;
    bool mixed = false;
    for (; end < n && !at(end).selected; ++end) {
      const int32_t o = at(end).object;
      if (o < 0) continue;
      if (object < 0) object = o;
      mixed = mixed || o != object;
    }
    if (k > 0 && end < n && !mixed) {
      for (size_t x = k; x < end; ++x) at(x).selected = true;
    }
    k = end;
  }

  // Rule 1: a cold part follows its parent, a local of the same object or a
  // global (GCC makes the part itself local to the parent's object).
  std::unordered_set<std::string_view> globals;
  std::set<std::pair<int32_t, std::string_view>> object_locals;
  for (size_t k = 0; k < n; ++k) {
    const LinkedFunction& f = at(k);
    if (!f.selected) continue;
    if (f.object < 0) {
      globals.insert(f.name);
    } else {
      object_locals.emplace(f.object, f.name);
    }
  }
  for (LinkedFunction& f : functions) {
    if (f.selected || !IsColdPart(f.name)) continue;
    const std::string_view parent = f.name.substr(0, f.name.find(kColdSuffix));
    f.selected = globals.contains(parent) || object_locals.contains({f.object, parent});
  }
}

}  // namespace tlsprof::symbols
