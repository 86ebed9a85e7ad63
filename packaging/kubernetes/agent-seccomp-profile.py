#!/usr/bin/env python3
"""agent-seccomp-profile.py DEFAULT.json > tlsprof-agent.json

The agent's Localhost seccomp profile, made from a container runtime's own default profile (for podman and
CRI-O: /usr/share/containers/seccomp.json). Those defaults (containers-common before late 2025, Debian 12's
included) answer bpf and perf_event_open with EPERM unless the container has CAP_SYS_ADMIN, so the agent, which
holds CAP_BPF and CAP_PERFMON instead, cannot load its sampler under RuntimeDefault. The profile written is the
default with two changes, the ones Docker 23+ and containerd 1.7+ ship in theirs:
  - the EPERM rule for each call is lifted by its own capability too (CAP_BPF for bpf, CAP_PERFMON for
    perf_event_open), not only by CAP_SYS_ADMIN;
  - both calls are allowed under those capabilities.
Everything else the runtime denies stays denied. Put the file under /var/lib/kubelet/seccomp/ on each node and
set the DaemonSet's seccompProfile to {type: Localhost, localhostProfile: <its path there>}; with podman, pass
--security-opt seccomp=<file>. packaging/README.md, "The images", says how this was found and tested.
"""
import json
import sys

CALLS = {"bpf": "CAP_BPF", "perf_event_open": "CAP_PERFMON"}


def agent_profile(default):
    """The profile `default` (a parsed runtime profile) with CALLS allowed under their capabilities."""
    rules = []
    for rule in default["syscalls"]:
        names = set(rule["names"])
        if rule["action"] == "SCMP_ACT_ALLOW" or not names & CALLS.keys():
            rules.append(rule)
            continue
        # A denial that names bpf or perf_event_open: each of the two is lifted by its own capability too.
        for name, cap in CALLS.items():
            if name in names:
                excludes = rule.get("excludes") or {}
                rules.append({**rule, "names": [name],
                              "excludes": {**excludes, "caps": excludes.get("caps", []) + [cap]}})
        rest = sorted(names - CALLS.keys())
        if rest:
            rules.append({**rule, "names": rest})
    rules += [{"names": [name], "action": "SCMP_ACT_ALLOW", "includes": {"caps": [cap]}}
              for name, cap in CALLS.items()]
    return {**default, "syscalls": rules}


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            default = json.load(f)
        profile = agent_profile(default)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"agent-seccomp-profile.py: {argv[1]}: not a readable seccomp profile ({e})", file=sys.stderr)
        return 1
    json.dump(profile, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
