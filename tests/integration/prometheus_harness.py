"""A real Prometheus server for integration tests.

Starts Debian's /usr/bin/prometheus on a free 127.0.0.1 port with a generated
config (scrape_interval 1s by default) and a TSDB in the test's temp dir,
waits for readiness (/-/ready) and for its targets to be up
(/api/v1/targets), and queries it over the HTTP API (/api/v1/query, instant,
now or at a given time). The process belongs to a tlsprof_testlib.Processes,
which kills it by PID when the test ends.

    procs = Processes()
    prom = Prometheus(procs, ["127.0.0.1:9464"])
    prom.start()
    prom.wait_targets_up()
    prom.wait_scraped_after(time.time())
    prom.value('sum(tlsprof_cpu_seconds_total)')

Several jobs and a rules file:
    Prometheus(procs, jobs={"tlsprof-collector": [c], "tlsprof-agent": [a]}, rule_files=[rules]).start()
"""
import datetime
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

from tlsprof_testlib import free_port

PROMETHEUS = os.environ.get("TLSPROF_PROMETHEUS", "/usr/bin/prometheus")
VICTORIA = os.environ.get("TLSPROF_VICTORIA_METRICS", "/usr/bin/victoria-metrics")
PROMTOOL = os.environ.get("TLSPROF_PROMTOOL", "/usr/bin/promtool")


class PrometheusError(AssertionError):
    pass


class Prometheus:
    """One Prometheus process scraping `targets` (HOST:PORT strings, /metrics)."""

    def __init__(self, procs, targets=(), scrape_interval="1s", job="tlsprof", name="prometheus", jobs=None,
                 rule_files=(), extra_args=()):
        """`targets` are scraped under job `job`; or `jobs` ({job name: [targets]})
        gives several scrape jobs. `rule_files` are loaded as the server's
        rule_files (evaluated every `scrape_interval`)."""
        if not os.access(PROMETHEUS, os.X_OK):
            raise PrometheusError(f"{PROMETHEUS} not found: install Debian's prometheus package "
                                  "(scripts/install-deps.sh)")
        self.procs = procs
        self.jobs = {name_: list(t) for name_, t in jobs.items()} if jobs else {job: list(targets)}
        self.targets = [t for ts in self.jobs.values() for t in ts]
        self.scrape_interval = scrape_interval
        self.job = job
        self.rule_files = [os.path.abspath(f) for f in rule_files]
        self.extra_args = list(extra_args)  # e.g. --web.enable-remote-write-receiver
        self.name = name
        self.port = None
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def config_text(self):
        # JSON is valid YAML: no YAML library needed to write the config.
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{
                "job_name": job,
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "static_configs": [{"targets": targets}],
            } for job, targets in self.jobs.items()],
        }
        if self.rule_files:
            config["rule_files"] = self.rule_files
        return json.dumps(config, indent=2)

    def start(self, timeout=60):
        config = self.procs.path(f"{self.name}.yml")
        with open(config, "w") as f:
            f.write(self.config_text())
        check = subprocess.run([PROMTOOL, "check", "config", config], capture_output=True, text=True)
        if check.returncode != 0:
            raise PrometheusError(f"promtool rejects the generated config:\n{check.stdout}{check.stderr}")
        data = self.procs.path(f"{self.name}-data")
        os.makedirs(data, exist_ok=True)
        # A port taken between free_port() and the bind shows as an early
        # exit; try a few ports before giving up.
        for attempt in range(3):
            self.port = free_port()
            argv = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *self.extra_args]
            try:
                self.proc = self.procs.start(argv, port=self.port, timeout=timeout)
                break
            except AssertionError as e:
                if attempt == 2 or "address already in use" not in str(e):
                    raise
        self.wait_ready(timeout)
        return self

    def stop(self):
        if self.proc is not None:
            self.procs.stop(self.proc)

    def log(self):
        return self.procs.log(self.proc) if self.proc else ""

    def _get(self, path, params=None, timeout=10):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()

    def _alive(self):
        if self.proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            self._alive()
            try:
                status, _ = self._get("/-/ready", timeout=2)
                if status == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready after {timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def api(self, path, params=None):
        """GET an /api/v1 endpoint; returns its `data` or raises with Prometheus's error."""
        self._alive()
        try:
            _, body = self._get(path, params)
        except urllib.error.HTTPError as e:
            body = e.read()
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {reply.get('errorType')}: {reply.get('error')}")
        return reply["data"]

    def targets_state(self):
        """The active targets: [{scrapeUrl, health, lastScrape (unix seconds), lastError}]."""
        out = []
        for t in self.api("/api/v1/targets", {"state": "active"})["activeTargets"]:
            out.append({
                "scrapeUrl": t["scrapeUrl"],
                "health": t["health"],
                "lastScrape": _parse_time(t["lastScrape"]),
                "lastError": t.get("lastError", ""),
            })
        return out

    def wait_targets_up(self, timeout=30):
        """Until every configured target has been scraped successfully."""
        return self._wait_targets(lambda t: t["health"] == "up", timeout, "up")

    def wait_scraped_after(self, unix_seconds, timeout=30):
        """Until every target has been scraped successfully after `unix_seconds`
        (e.g. the moment a load finished), and the scrape's samples can be
        queried: queries then see final counters. A target's lastScrape is
        set before its samples are committed (a first scrape would read as
        no data), so the wait ends on `up`'s timestamps, committed with them."""
        deadline = time.monotonic() + timeout
        state = self._wait_targets(lambda t: t["health"] == "up" and t["lastScrape"] > unix_seconds, timeout,
                                   f"scraped after {unix_seconds:.3f}")
        while True:
            stamps = [float(r["value"][1]) for r in self.query("timestamp(up)")]
            if len(stamps) >= len(self.targets) and all(t > unix_seconds for t in stamps):
                return state
            if time.monotonic() > deadline:
                raise PrometheusError(f"no scrape after {unix_seconds:.3f} is queryable after {timeout} s: "
                                      f"timestamp(up) {stamps}")
            time.sleep(0.1)

    def _wait_targets(self, ok, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            state = self.targets_state()
            if len(state) == len(self.targets) and all(ok(t) for t in state):
                return state
            if time.monotonic() > deadline:
                raise PrometheusError(f"targets not {what} after {timeout} s: {state}\n{self.log()}")
            time.sleep(0.2)

    def query(self, expr, at=None):
        """Instant query, now or at `at` (unix seconds); returns the result list
        [{metric: {labels}, value: [t, "v"]}] of a vector, or [t, "v"] of a scalar."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("/api/v1/query", params)
        return data["result"]

    def vector(self, expr, by, at=None):
        """An instant vector as {label value (or tuple of values for a list of labels): float}."""
        out = {}
        for sample in self.query(expr, at):
            labels = sample["metric"]
            key = tuple(labels.get(b, "") for b in by) if isinstance(by, (list, tuple)) else labels.get(by, "")
            if key in out:
                raise PrometheusError(f"{expr}: two series for {key}")
            out[key] = float(sample["value"][1])
        return out

    def query_range(self, expr, start, end, step):
        """Range query; returns the matrix [{metric: {labels}, values: [[t, "v"], ...]}]."""
        data = self.api("/api/v1/query_range",
                        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"})
        return data["result"]

    def rule_groups(self):
        """/api/v1/rules: the loaded rule groups, each with its rules' health and lastError."""
        return self.api("/api/v1/rules")["groups"]

    def value(self, expr, at=None):
        """A query that yields one sample (or a scalar): its value as float."""
        result = self.query(expr, at)
        if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):
            return float(result[1])  # scalar
        if len(result) != 1:
            raise PrometheusError(f"{expr}: expected one sample, got {len(result)}: {result[:3]}")
        return float(result[0]["value"][1])


def check_metrics(text):
    """`promtool check metrics` on an exposition; returns (ok, promtool's output)."""
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def scrape(host_port, path="/metrics", timeout=10):
    """GET http://HOST:PORT/metrics as text."""
    with urllib.request.urlopen(f"http://{host_port}{path}", timeout=timeout) as r:
        return r.read().decode()


_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _parse_time(s):
    """RFC 3339 with up to nanoseconds (Go's time.Time in JSON) as unix seconds."""
    m = _TIME.match(s)
    if not m:
        raise PrometheusError(f"unexpected time format {s!r}")
    if s.startswith("0001-01-01"):  # the zero time: never scraped
        return 0.0
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    offset = 0
    if m.group(3) != "Z":
        sign = 1 if m.group(3)[0] == "+" else -1
        offset = sign * (int(m.group(3)[1:3]) * 3600 + int(m.group(3)[4:6]) * 60)
    return t.timestamp() + (float(m.group(2)) if m.group(2) else 0.0) - offset


class VictoriaMetrics:
    """Debian's victoria-metrics on a free port, its data in the test's dir;
    queries see samples at once (-search.latencyOffset=0s)."""

    def __init__(self, procs):
        if not os.access(VICTORIA, os.X_OK):
            raise AssertionError(f"{VICTORIA} not found: install Debian's victoria-metrics (scripts/install-deps.sh)")
        self.port = free_port()
        argv = [VICTORIA, f"-storageDataPath={procs.path('victoria-data')}",
                f"-httpListenAddr=127.0.0.1:{self.port}", "-search.latencyOffset=0s",
                "-search.disableCache", "-loggerLevel=WARN"]
        self.proc = procs.start(argv, port=self.port, timeout=60)

    @property
    def write_url(self):
        return f"http://127.0.0.1:{self.port}/api/v1/write"

    def query(self, promql):
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError(f"VictoriaMetrics: {body}")
        return {json.dumps(x["metric"], sort_keys=True): float(x["value"][1]) for x in body["data"]["result"]}


def prom_query(prom, promql):
    data = prom.api("/api/v1/query", {"query": promql})
    return {json.dumps(x["metric"], sort_keys=True): float(x["value"][1]) for x in data["result"]}


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def series(text, name):
    """(labels, value) of each sample of `name` in an exposition."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            labels = dict(_LABEL.findall(head[len(name):]))
            out.append((labels, float(value)))
    return out


def metric_sum(text, name, **labels):
    return sum(v for ls, v in series(text, name) if all(ls.get(k) == w for k, w in labels.items()))
