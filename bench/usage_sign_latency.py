#!/usr/bin/env python3
"""usage_sign_latency.py: are the usage probes' signature latencies right?

Issue 4's "signing loop" check: the p50 on-CPU sign latency the agent reports
for each key type, against what `openssl speed` measures for the same
OpenSSL on this machine. `openssl speed` signs through EVP_PKEY_sign (RSA,
ECDSA) and EVP_DigestSign (EdDSA), the functions the probes time.

For each algorithm, two runs of `openssl speed -seconds S ALG`:
  1. alone: speed's own time per sign (1 / sign/s), the anchor;
  2. under `tlsprof-agent profile --usage --pid <speed>`: the agent's p50,
     p99 and mean per sign, and speed's own figure again (the probes' cost
     shows as its slowdown).
It prints them side by side with the ratio agent p50 / anchor. Root only
(BPF). Python 3 standard library only.

    sudo python3 bench/usage_sign_latency.py [--seconds 5] [--bin DIR] [--alg rsa2048 ...]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGS = {  # speed's name -> the agent's algorithm name
    "rsa2048": "RSA-2048",
    "rsa3072": "RSA-3072",
    "ecdsap256": "ECDSA-P256",
    "ecdsap384": "ECDSA-P384",
    "ed25519": "Ed25519",
}


def speed_sign_seconds(output):
    """Seconds per sign from speed's last table line (sign/s is the precise column)."""
    for line in reversed(output.splitlines()):
        m = re.search(r"\s([0-9.]+)s\s+([0-9.]+)s\s+([0-9.]+)\s+([0-9.]+)\s*$", line)
        if m:
            return 1.0 / float(m.group(3))
    raise SystemExit(f"cannot read openssl speed's output:\n{output}")


def run_speed(alg, seconds):
    out = subprocess.run(["openssl", "speed", "-seconds", str(seconds), alg], capture_output=True, text=True,
                         check=True)
    return speed_sign_seconds(out.stdout)


def run_under_agent(agent, alg, seconds):
    with tempfile.TemporaryDirectory(prefix="tlsprof-bench-") as tmp:
        speed = subprocess.Popen(["openssl", "speed", "-seconds", str(seconds), alg], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        report_path = os.path.join(tmp, "report.json")
        # Sign phase first, then verify: the window covers both.
        agent_proc = subprocess.run([agent, "profile", "--usage", "--pid", str(speed.pid), "--duration",
                                     str(2 * seconds + 2), "--format", "json", "-o", report_path],
                                    capture_output=True, text=True)
        out, _ = speed.communicate()
        if agent_proc.returncode != 0:
            raise SystemExit(f"tlsprof-agent failed: {agent_proc.stderr[-2000:]}")
        with open(report_path) as f:
            report = json.load(f)
    rows = [o for o in report["operations"] if o["operation"] == "sign" and o["algorithm"] == ALGS[alg]]
    if not rows:
        raise SystemExit(f"no {ALGS[alg]} sign in the agent's report: {report['operations']}\n"
                         f"{agent_proc.stderr[-3000:]}")
    row = max(rows, key=lambda o: o["count"])
    return row, speed_sign_seconds(out), report["agent"]["usage"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5, help="openssl speed -seconds (per phase)")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"), help="where tlsprof-agent is")
    ap.add_argument("--alg", nargs="+", default=["rsa2048", "ecdsap256", "ed25519"], choices=sorted(ALGS))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (BPF)")
    agent = os.path.join(args.bin, "tlsprof-agent")
    print("$ " + " ".join(["python3"] + sys.argv))
    print(f"openssl: {subprocess.run(['openssl', 'version'], capture_output=True, text=True).stdout.strip()}")
    print(f"{'algorithm':<12} {'speed alone':>12} {'agent p50':>10} {'p50/speed':>10} {'agent p99':>10} "
          f"{'agent mean':>11} {'signs':>8} {'speed probed':>13}")
    for alg in args.alg:
        anchor = run_speed(alg, args.seconds)
        row, probed, _ = run_under_agent(agent, alg, args.seconds)
        p50 = row["latency_p50_us"] / 1e6
        print(f"{ALGS[alg]:<12} {anchor * 1e6:>10.1f}us {row['latency_p50_us']:>8.1f}us {p50 / anchor:>10.3f} "
              f"{row['latency_p99_us']:>8.1f}us {row['latency_mean_us']:>9.1f}us {row['count']:>8} "
              f"{probed * 1e6:>11.1f}us")
        time.sleep(1)


if __name__ == "__main__":
    main()
