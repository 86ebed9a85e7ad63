#include "common/privilege/privilege.h"

#include <dirent.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace tlsprof::privilege {
namespace {

struct CapFree {
  void operator()(cap_t c) const { cap_free(c); }
};
using CapPtr = std::unique_ptr<std::remove_pointer_t<cap_t>, CapFree>;

std::string Errno(int err) { return std::strerror(err); }

// Threads of this process, from /proc/self/task (the only complete list).
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

std::string CapName(cap_value_t cap) {
  char* name = cap_to_name(cap);
  if (name == nullptr) return fmt::format("cap_{}", cap);
  std::string out = name;
  cap_free(name);
  return out;
}

// The capabilities for which `has(cap)` holds, named; "none" / "all".
template <typename Has>
std::string SetText(Has has) {
  const cap_value_t last = static_cast<cap_value_t>(cap_max_bits()) - 1;
  std::vector<cap_value_t> in;
  for (cap_value_t c = 0; c <= last; ++c) {
    if (has(c)) in.push_back(c);
  }
  if (in.empty()) return "none";
  if (in.size() == static_cast<size_t>(last) + 1) return "all";
  return Names(in);
}

}  // namespace

std::string Names(std::span<const cap_value_t> caps) {
  std::string out;
  for (cap_value_t c : caps) {
    if (!out.empty()) out += ',';
    out += CapName(c);
  }
  return out.empty() ? "none" : out;
}

Status KeepOnly(std::span<const cap_value_t> keep) {
  if (int threads = ThreadCount(); threads != 1) {
    return MakeError(
        "internal error: capabilities are dropped per thread, and this process already has {} threads; "
        "drop them before any thread starts",
        threads);
  }
  auto kept = [&keep](cap_value_t c) { return std::find(keep.begin(), keep.end(), c) != keep.end(); };
  CapPtr current(cap_get_proc());
  if (!current) return MakeError("cap_get_proc: {}", Errno(errno));
  const cap_value_t last = static_cast<cap_value_t>(cap_max_bits()) - 1;

  // Bounding set first: dropping from it needs CAP_SETPCAP in the effective
  // set, which the last step takes away. Without CAP_SETPCAP (started by a
  // non-root user with file or ambient capabilities) the bounding set cannot
  // shrink; PR_SET_NO_NEW_PRIVS below makes it moot for exec.
  cap_flag_value_t setpcap = CAP_CLEAR;
  cap_get_flag(current.get(), CAP_SETPCAP, CAP_EFFECTIVE, &setpcap);
  if (setpcap == CAP_SET) {
    for (cap_value_t c = 0; c <= last; ++c) {
      if (kept(c) || cap_get_bound(c) != 1) continue;
      if (cap_drop_bound(c) != 0) return MakeError("cap_drop_bound({}): {}", CapName(c), Errno(errno));
    }
  }
  // Ambient capabilities would be handed to any program this process runs.
  if (cap_reset_ambient() != 0 && errno != EINVAL) return MakeError("cap_reset_ambient: {}", Errno(errno));
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return MakeError("PR_SET_NO_NEW_PRIVS: {}", Errno(errno));

  // Effective and permitted: what we have of `keep`; inheritable: nothing.
  CapPtr next(cap_init());
  if (!next) return MakeError("cap_init: {}", Errno(errno));
  std::vector<cap_value_t> have;
  for (cap_value_t c : keep) {
    cap_flag_value_t permitted = CAP_CLEAR;
    if (cap_get_flag(current.get(), c, CAP_PERMITTED, &permitted) == 0 && permitted == CAP_SET) have.push_back(c);
  }
  if (!have.empty()) {
    const int n = static_cast<int>(have.size());
    if (cap_set_flag(next.get(), CAP_PERMITTED, n, have.data(), CAP_SET) != 0 ||
        cap_set_flag(next.get(), CAP_EFFECTIVE, n, have.data(), CAP_SET) != 0) {
      return MakeError("cap_set_flag: {}", Errno(errno));
    }
  }
  if (cap_set_proc(next.get()) != 0) return MakeError("cap_set_proc: {}", Errno(errno));
  return OkStatus();
}

Status SetEffective(cap_value_t cap, bool on) {
  CapPtr current(cap_get_proc());
  if (!current) return MakeError("cap_get_proc: {}", Errno(errno));
  if (cap_set_flag(current.get(), CAP_EFFECTIVE, 1, &cap, on ? CAP_SET : CAP_CLEAR) != 0 ||
      cap_set_proc(current.get()) != 0) {
    return MakeError("{} {} in the effective set: {}", on ? "raising" : "clearing", CapName(cap), Errno(errno));
  }
  return OkStatus();
}

bool HasEffective(cap_value_t cap) {
  CapPtr current(cap_get_proc());
  cap_flag_value_t v = CAP_CLEAR;
  return current && cap_get_flag(current.get(), cap, CAP_EFFECTIVE, &v) == 0 && v == CAP_SET;
}

std::string Describe() {
  CapPtr current(cap_get_proc());
  if (!current) return fmt::format("(cap_get_proc: {})", Errno(errno));
  auto flag = [&current](cap_flag_t which) {
    return SetText([&](cap_value_t c) {
      cap_flag_value_t v = CAP_CLEAR;
      return cap_get_flag(current.get(), c, which, &v) == 0 && v == CAP_SET;
    });
  };
  return fmt::format(
      "effective={} permitted={} inheritable={} bounding={} ambient={} no_new_privs={}", flag(CAP_EFFECTIVE),
      flag(CAP_PERMITTED), flag(CAP_INHERITABLE), SetText([](cap_value_t c) { return cap_get_bound(c) == 1; }),
      SetText([](cap_value_t c) { return cap_get_ambient(c) == 1; }), prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
}

}  // namespace tlsprof::privilege
