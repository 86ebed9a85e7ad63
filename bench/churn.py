#!/usr/bin/env python3
"""What does `tlsprof-agent run` cost, in memory and CPU, on a host with 1,000
TLS processes that keep exiting and being replaced?

    sudo python3 bench/churn.py                        # 1,000 processes, 60 s measured (~2 min)
    sudo python3 bench/churn.py --procs 200 --duration 20 --memory-limit 256MiB --json out.json

Runs `tlsprof-agent run` (no collector: /metrics only), then keeps --procs
tlsprof-tls-tick processes alive (each maps Debian's libcrypto.so.3 and hashes
--work x 4 KiB with SHA-256 every --period-ms, then exits after a lifetime
drawn uniformly from [0.5, 1.5] x --lifetime s and is replaced at once), plus
one tlsprof-many-symbols (100k function symbols, static libcrypto) unless
--no-many-symbols. After --warmup s it measures for --duration s:

- the agent's peak RSS (VmHWM of /proc/PID/status, since its start) and its
  RSS at the end (VmRSS);
- the agent's CPU (utime + stime of /proc/PID/stat) as % of one core;
- the workload's CPU, the same way: every process alive at the start or end of
  the measurement, plus those reaped in between (RUSAGE_CHILDREN);
- the TLS CPU the agent attributed (tlsprof_cpu_seconds_total of its /metrics)
  next to the workload's, its dropped samples and its memory-limit counters;
- churn: processes started per second.

Python 3 standard library only; run as root. Every process it started is ended
by its pid. Exits 1 if a phase fails.
"""
import argparse
import json
import os
import random
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
from tlsprof_testlib import free_port, metric_sum, scrape  # noqa: E402  (stdlib only, shared with the tests)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_ticks(pid):
    """utime + stime of a process (also a zombie), in clock ticks; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/{pid}/status")


class Pool:
    """Keeps `procs` tlsprof-tls-tick processes alive; each exits after its
    lifetime (0: never) and is replaced by the next reap()."""

    def __init__(self, binary, procs, lifetime_s, period_ms, work, seed=1):
        self.binary, self.target, self.lifetime_s = binary, procs, lifetime_s
        self.period_ms, self.work = period_ms, work
        self.rng = random.Random(seed)
        self.alive = {}  # pid -> Popen
        self.started = 0
        self.failed = 0

    def _spawn(self):
        argv = [self.binary, "--period-ms", str(self.period_ms), "--work", str(self.work)]
        if self.lifetime_s > 0:
            argv += ["--lifetime-ms", str(int(self.lifetime_s * 1000 * self.rng.uniform(0.5, 1.5)))]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.alive[p.pid] = p
        self.started += 1

    def fill(self):
        while len(self.alive) < self.target:
            self._spawn()

    def reap(self):
        """Reaps the processes that exited (their CPU goes to RUSAGE_CHILDREN) and replaces them."""
        for pid, p in list(self.alive.items()):
            if p.poll() is not None:
                del self.alive[pid]
                if p.returncode != 0:
                    self.failed += 1
        self.fill()

    def ticks(self):
        return sum(t for t in (proc_ticks(pid) for pid in self.alive) if t is not None)

    def stop(self):
        for p in self.alive.values():
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.alive.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.alive.clear()


def many_ticks(proc):
    return (proc_ticks(proc.pid) or 0) if proc else 0


def children_ticks():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * CLK_TCK


class Agent:
    """`tlsprof-agent run` with /metrics on a free port."""

    def __init__(self, bin_dir, args, log_path):
        self.port = free_port()
        self.argv = [os.path.join(bin_dir, "tlsprof-agent"), "run", "--metrics-listen", f"127.0.0.1:{self.port}"] + args
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_windows(self, n, timeout):
        """Waits until the agent has closed n windows (tlsprof_agent_windows_total)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.proc.returncode}:\n{self.log()}")
            try:
                text = scrape(self.port)
                if metric_sum(text, "tlsprof_agent_windows_total") >= n:
                    return text
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the agent closed fewer than {n} windows in {timeout} s:\n{self.log()}")

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def run(opts, log=print):
    """Runs one measurement; returns a dict of every figure."""
    tick = os.path.join(opts.bin, "tlsprof-tls-tick")
    many = os.path.join(opts.bin, "tlsprof-many-symbols")
    for b in [tick, os.path.join(opts.bin, "tlsprof-agent")] + ([many] if opts.many_symbols else []):
        if not os.access(b, os.X_OK):
            raise RuntimeError(f"{b} is missing: build with ./scripts/build.sh")
    tmp = tempfile.TemporaryDirectory(prefix="tlsprof-churn-")
    agent_args = ["--interval", str(opts.interval), "--frequency", str(opts.frequency)]
    if opts.memory_limit is not None:
        agent_args += ["--memory-limit", opts.memory_limit]
    agent_args += opts.agent_arg
    pool = Pool(tick, opts.procs, opts.lifetime, opts.period_ms, opts.work)
    many_proc = None
    agent = None
    try:
        if opts.many_symbols:
            ready = os.path.join(tmp.name, "many.ready")
            many_proc = subprocess.Popen([many, "--ready-file", ready], stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while not os.path.exists(ready):
                if many_proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("tlsprof-many-symbols did not start")
                time.sleep(0.05)
        t0 = time.monotonic()
        pool.fill()
        log(f"{opts.procs} processes started in {time.monotonic() - t0:.1f} s")
        agent = Agent(opts.bin, agent_args, os.path.join(tmp.name, "agent.log"))
        # Warm-up: the agent snapshots what runs, then churn goes on.
        end_warmup = time.monotonic() + opts.warmup
        while time.monotonic() < end_warmup:
            pool.reap()
            if agent.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.proc.returncode}:\n{agent.log()}")
            time.sleep(0.1)
        first = agent.wait_windows(1, opts.interval * 3 + 60)
        # Measure.
        pool.reap()
        started0 = pool.started
        w0 = pool.ticks() + children_ticks() + many_ticks(many_proc)
        a0 = proc_ticks(agent.proc.pid)
        m0 = time.monotonic()
        tls0 = metric_sum(first, "tlsprof_cpu_seconds_total")
        windows0 = metric_sum(first, "tlsprof_agent_windows_total")
        peak_rss_seen = 0
        end = m0 + opts.duration
        while time.monotonic() < end:
            pool.reap()
            if agent.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.proc.returncode}:\n{agent.log()}")
            peak_rss_seen = max(peak_rss_seen, proc_status_kib(agent.proc.pid, "VmRSS"))
            time.sleep(0.1)
        pool.reap()
        w1 = pool.ticks() + children_ticks() + many_ticks(many_proc)
        a1 = proc_ticks(agent.proc.pid)
        m1 = time.monotonic()
        # The windows closed during the measurement carry its TLS CPU.
        last = agent.wait_windows(windows0 + max(1, round(opts.duration / opts.interval)), opts.interval * 3 + 60)
        hwm = proc_status_kib(agent.proc.pid, "VmHWM")
        rss = proc_status_kib(agent.proc.pid, "VmRSS")
        elapsed = m1 - m0
        result = {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "agent_argv": agent.argv,
            "procs": opts.procs,
            "lifetime_s": opts.lifetime,
            "many_symbols": opts.many_symbols,
            "measured_s": round(elapsed, 1),
            "spawned_per_s": round((pool.started - started0) / elapsed, 1),
            "workload_failures": pool.failed,
            "agent_peak_rss_mib": round(hwm / 1024, 1),
            "agent_rss_end_mib": round(rss / 1024, 1),
            "agent_rss_max_sampled_mib": round(peak_rss_seen / 1024, 1),
            "agent_cpu_pct_core": round(100 * (a1 - a0) / CLK_TCK / elapsed, 2),
            "workload_cpu_pct_core": round(100 * (w1 - w0) / CLK_TCK / elapsed, 1),
            "tls_cpu_attributed_pct_core": round(
                100 * (metric_sum(last, "tlsprof_cpu_seconds_total") - tls0) / elapsed, 2),
            "dropped_samples": metric_sum(last, "tlsprof_agent_dropped_samples_total"),
            "tracked_processes": metric_sum(last, "tlsprof_agent_tracked_processes"),
            "memory_limit_bytes": metric_sum(last, "tlsprof_agent_memory_limit_bytes"),
            "memory_limited_symbols": metric_sum(last, "tlsprof_agent_memory_limited_total", what="symbols"),
            "memory_limited_unwind_tables": metric_sum(last, "tlsprof_agent_memory_limited_total",
                                                       what="unwind_table"),
            "metrics": last,
            "agent_log": agent.log(),
        }
        return result
    finally:
        if agent:
            agent.stop()
        pool.stop()
        if many_proc and many_proc.poll() is None:
            many_proc.terminate()
            many_proc.wait()
        tmp.cleanup()


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("TLSPROF_BIN", os.path.join(REPO, "build", "bin")))
    ap.add_argument("--procs", type=int, default=1000)
    ap.add_argument("--lifetime", type=float, default=30.0, help="mean process lifetime, s (0: no churn)")
    ap.add_argument("--period-ms", type=int, default=1000, help="tlsprof-tls-tick's tick")
    ap.add_argument("--work", type=int, default=16, help="4 KiB SHA-256 updates per tick")
    ap.add_argument("--no-many-symbols", dest="many_symbols", action="store_false")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=10.0, help="the agent's window")
    ap.add_argument("--frequency", type=int, default=99)
    ap.add_argument("--memory-limit", default=None, help="the agent's --memory-limit (default: its own)")
    ap.add_argument("--agent-arg", action="append", default=[], help="more flags for tlsprof-agent run")
    ap.add_argument("--json", help="write every figure here")
    return ap


def main():
    opts = parser().parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/churn.py: run as root (the agent loads BPF)")
    print("#", " ".join(shlex.quote(a) for a in sys.argv))
    try:
        r = run(opts)
    except (RuntimeError, OSError) as e:
        print(f"bench/churn.py: {e}", file=sys.stderr)
        return 1
    print(f"{r['procs']} TLS processes, mean lifetime {r['lifetime_s']} s ({r['spawned_per_s']} started/s), "
          f"{'+ tlsprof-many-symbols (100k symbols), ' if r['many_symbols'] else ''}measured {r['measured_s']} s")
    rows = [
        ("agent peak RSS (VmHWM)", f"{r['agent_peak_rss_mib']} MiB"),
        ("agent RSS at the end", f"{r['agent_rss_end_mib']} MiB"),
        ("agent CPU", f"{r['agent_cpu_pct_core']} % of a core"),
        ("workload CPU", f"{r['workload_cpu_pct_core']} % of a core"),
        ("TLS CPU attributed", f"{r['tls_cpu_attributed_pct_core']} % of a core"),
        ("dropped samples", f"{r['dropped_samples']:.0f}"),
        ("tracked processes (end)", f"{r['tracked_processes']:.0f}"),
        ("memory limit", f"{r['memory_limit_bytes'] / 2**20:.0f} MiB"),
        ("loads refused by the limit", f"symbols {r['memory_limited_symbols']:.0f}, "
                                       f"unwind tables {r['memory_limited_unwind_tables']:.0f}"),
        ("workload processes that failed", str(r["workload_failures"])),
    ]
    for name, value in rows:
        print(f"  {name:<32} {value}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
