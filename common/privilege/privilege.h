// Least privilege (docs/fleet.md, "Capabilities"): after its set-up a process
// keeps only the capabilities it still needs, in every set the kernel has
// (effective, permitted, inheritable, bounding, ambient), and sets
// PR_SET_NO_NEW_PRIVS so that no exec can gain any back.
//
// Capabilities belong to threads, not processes: a thread keeps the set it had
// when another thread dropped, and a new thread inherits its creator's. So
// KeepOnly() refuses to run once the process has a second thread; call it
// before anything starts one (gRPC, the metrics server, the shipper).
// Not thread-safe (by design: single-threaded callers only).
#pragma once

#include <sys/capability.h>

#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace tlsprof::privilege {

// Reduces the calling (only) thread's capabilities to `keep` ∩ permitted:
// the bounding set (when CAP_SETPCAP allows; without it, as under file or
// ambient capabilities, NO_NEW_PRIVS alone stops exec from raising the set),
// the ambient set, inheritable, permitted and effective; then sets
// PR_SET_NO_NEW_PRIVS. Capabilities of `keep` that the process does not have
// are not an error (they cannot be gained); the caller checks what it needs.
Status KeepOnly(std::span<const cap_value_t> keep);

// Clears `cap` from the effective set only (it stays permitted), or raises it
// again. For probing whether a step needs it.
Status SetEffective(cap_value_t cap, bool on);

// True if `cap` is in the calling thread's effective set.
bool HasEffective(cap_value_t cap);

// The calling thread's sets, one line: "effective=cap_bpf,cap_perfmon
// permitted=... bounding=... ambient=... no_new_privs=1". "none" for an empty
// set; "all" for every capability the kernel knows.
std::string Describe();

// Capability names as libcap spells them (cap_sys_ptrace), for messages.
std::string Names(std::span<const cap_value_t> caps);

}  // namespace tlsprof::privilege
