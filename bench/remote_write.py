#!/usr/bin/env python3
"""remote_write.py: how fast does a collector deliver its series to a TSDB,
beside Prometheus scraping the same collector?

Starts a real VictoriaMetrics (Debian's victoria-metrics), a tlsprof-collector
(--insecure) that remote-writes to it every --interval seconds, and a real
Prometheus scraping the same collector's /metrics at the same interval.
tlsprof-loadgen first fills the collector with series (one window from each of
--agents agents, --series rows each, over --services services: the collector's
tlsprof_collector_series says how many that made). Then, for --duration
seconds, both paths run side by side and it prints, per path:

- samples per cycle (a push; a scrape),
- seconds per cycle: remote write = collecting, encoding and compressing a
  push + its requests
  (tlsprof_collector_remote_write_{encode,send}_seconds_total); scraping =
  Prometheus' scrape_duration_seconds,
- samples/s = samples per cycle / seconds per cycle,
- the CPU of the collector, VictoriaMetrics and Prometheus over the run.

Exits 1 when remote write delivers fewer than --target samples/s.
Everything shares this machine's CPUs; the load average is printed first.
Hold the measure lock (flock -x /tmp/tlsprof-measure.lock) so no build runs beside it.

    python3 bench/remote_write.py [--agents 2000] [--series 100] [--services 2000]
        [--interval 5] [--duration 30] [--target 200000] [--bin DIR]
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
from prometheus_harness import Prometheus, VictoriaMetrics, metric_sum, scrape  # noqa: E402
from tlsprof_testlib import Processes, free_port  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--series", type=int, default=100)
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--interval", type=float, default=5)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--target", type=float, default=200_000)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    args = ap.parse_args()
    collector_bin = os.path.join(args.bin, "tlsprof-collector")
    loadgen_bin = os.path.join(args.bin, "tlsprof-loadgen")
    for b in (collector_bin, loadgen_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"remote_write.py: {b} is not built (./scripts/build.sh)")

    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    procs = Processes()
    try:
        vm = VictoriaMetrics(procs)
        grpc_port, metrics_port = free_port(), free_port()
        collector = procs.start(
            [collector_bin, "--insecure", "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen",
             f"127.0.0.1:{metrics_port}", "--max-series", "1000000", "--max-agents", str(max(args.agents, 10000)),
             "--max-services-per-agent", "64", "--max-series-per-agent", "2000",
             "--remote-write", vm.write_url, "--remote-write-interval", str(args.interval),
             "--remote-write-label", "collector=bench"], port=metrics_port, timeout=30)
        target = f"127.0.0.1:{metrics_port}"
        fill = subprocess.run(
            [loadgen_bin, "--insecure", "--collector", f"127.0.0.1:{grpc_port}", "--agents", str(args.agents),
             "--series", str(args.series), "--services", str(args.services), "--total-windows", "1",
             "--connections", "4"], capture_output=True, text=True, timeout=600)
        if fill.returncode != 0:
            sys.exit(f"remote_write.py: the loadgen failed:\n{fill.stdout}\n{fill.stderr}")
        text = scrape(target)
        series = metric_sum(text, "tlsprof_collector_series")
        print(f"collector: {series:.0f} data series from {args.agents} agents x {args.series} rows "
              f"over {args.services} services; {len(text.splitlines())} exposition lines")

        prom = Prometheus(procs, [target], scrape_interval=f"{args.interval:g}s").start()
        prom.wait_targets_up(timeout=60)
        time.sleep(2 * args.interval)  # a push and a scrape in steady state

        pids = {"collector": collector.pid, "victoria-metrics": vm.proc.pid, "prometheus": prom.proc.pid}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        before = scrape(target)
        t0 = time.monotonic()
        time.sleep(args.duration)
        after = scrape(target)
        elapsed = time.monotonic() - t0
        cpu = {k: (cpu_seconds(p) - cpu0[k]) / elapsed for k, p in pids.items()}

        def delta(name, **labels):
            return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

        samples = delta("tlsprof_collector_remote_write_samples_total")
        requests = delta("tlsprof_collector_remote_write_requests_total", result="sent")
        send = delta("tlsprof_collector_remote_write_send_seconds_total")
        encode = delta("tlsprof_collector_remote_write_encode_seconds_total")
        for bad in ("rejected", "dropped"):
            if delta("tlsprof_collector_remote_write_requests_total", result=bad):
                sys.exit(f"remote_write.py: requests {bad} during the run: the numbers would not hold")
        pushes = max(1, round(elapsed / args.interval))
        rw_rate = samples / (send + encode) if send + encode > 0 else 0.0

        window = f"{int(args.duration)}s"
        scrape_samples = prom.value(f"avg_over_time(scrape_samples_scraped[{window}])")
        scrape_seconds = prom.value(f"avg_over_time(scrape_duration_seconds[{window}])")
        scrape_rate = scrape_samples / scrape_seconds if scrape_seconds > 0 else 0.0

        print(f"\n{'path':<34}{'samples/cycle':>14}{'s/cycle':>10}{'samples/s':>12}")
        print(f"{'remote write (encode + requests)':<34}{samples / pushes:>14,.0f}{(send + encode) / pushes:>10.3f}"
              f"{rw_rate:>12,.0f}")
        print(f"{'  of which requests only':<34}{'':>14}{send / pushes:>10.3f}"
              f"{(samples / send if send else 0):>12,.0f}")
        print(f"{'Prometheus scraping /metrics':<34}{scrape_samples:>14,.0f}{scrape_seconds:>10.3f}"
              f"{scrape_rate:>12,.0f}")
        print(f"ratio remote write / scraping: {rw_rate / scrape_rate if scrape_rate else float('inf'):.2f}x; "
              f"{requests:.0f} requests in {pushes} pushes over {elapsed:.1f} s")
        print("CPU over the run (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
        ok = rw_rate >= args.target
        print(f"acceptance: remote write {rw_rate:,.0f} samples/s >= {args.target:,.0f}: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        procs.close()


if __name__ == "__main__":
    sys.exit(main())
