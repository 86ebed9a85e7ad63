/* The hijacked_returns map (struct hijacked_returns in usage.h), declared
 * once for the two objects that share it: profile.bpf.c (the CPU sampler,
 * which creates it and reads it while unwinding) and usage.bpf.c (the usage
 * probes, which reuse the sampler's map and fill it). BPF C only.
 */
#ifndef TLSPROF_BPF_HIJACKED_RETURNS_BPF_H
#define TLSPROF_BPF_HIJACKED_RETURNS_BPF_H

#include "usage.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, USAGE_MAX_HIJACKED_THREADS);
	__type(key, __u32);
	__type(value, struct hijacked_returns);
} hijacked_returns SEC(".maps");

#endif /* TLSPROF_BPF_HIJACKED_RETURNS_BPF_H */
