"""The collector's status page (collector/expose/web/) in a real browser.

Debian's Chromium, headless, loads the page from a live collector fed by the
demo workload (demo_fleet.DemoFleet: agent daemon + tlsprof-demo) and dumps
the DOM after the scripts ran (--virtual-time-budget lets the page fetch the
API, draw, and refresh once). The page writes what it shows into data-*
attributes; the test checks them against the collector's JSON API, and checks
that the screenshot is a real PNG in which the charts' colours appear.
It also loads the page from a collector no agent has reported to: the page
must say so, and no script error may occur (the page lists window.onerror,
rejected promises and CSP violations in #errors).

The screenshot is kept: $TLSPROF_TEST_OUTPUT/status-page.png, by default
build/test-output/status-page.png (the path is printed).
"""
import html.parser
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request
import zlib

from demo_fleet import COLLECTOR, DemoFleet
from tlsprof_testlib import BIN, Processes, free_port, require_root

CHROMIUM = "/usr/bin/chromium"
OUTPUT_DIR = os.environ.get("TLSPROF_TEST_OUTPUT", os.path.join(BIN, "..", "test-output"))
SHARE_TOLERANCE = 1e-9  # the page shows a value the API gave while it loaded (JSON round trip)
# status.js's BUCKET_COLORS: solid fills in the doughnut and the bars.
BUCKET_COLORS = {"cipher": (0x4E, 0x79, 0xA7), "signature": (0xF2, 0x8E, 0x2B), "key_exchange": (0x59, 0xA1, 0x4F),
                 "hash": (0xE1, 0x57, 0x59), "other": (0x9A, 0x9A, 0x9A)}


def get(http, path):
    with urllib.request.urlopen(f"http://{http}{path}", timeout=10) as r:
        return r.status, dict(r.headers), r.read()


def get_json(http, path):
    return json.loads(get(http, path)[2])


class Dom(html.parser.HTMLParser):
    """Chromium's serialized DOM as a small tree: elements by id, with their
    attributes and text (hidden elements included)."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.root = {"tag": "#root", "attrs": {}, "children": [], "text": []}
        self.stack = [self.root]
        self.by_id = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": {k: (v if v is not None else "") for k, v in attrs}, "children": [], "text": []}
        self.stack[-1]["children"].append(node)
        if "id" in node["attrs"]:
            self.by_id[node["attrs"]["id"]] = node
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1]["text"].append(data)

    def text(self, node):
        if isinstance(node, str):
            node = self.by_id[node]
        return "".join(node["text"]) + "".join(self.text(c) for c in node["children"])

    def attr(self, id_, name):
        return self.by_id[id_]["attrs"].get(name)

    def find_all(self, node, tag):
        for c in node["children"]:
            if c["tag"] == tag:
                yield c
            yield from self.find_all(c, tag)


def chromium(args, url, timeout=90):
    """Runs headless Chromium once with a fresh profile; returns stdout."""
    if not os.path.exists(CHROMIUM):
        raise AssertionError(f"{CHROMIUM} is missing: scripts/install-deps.sh installs Debian's chromium")
    profile = tempfile.mkdtemp(prefix="tlsprof-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1", "--lang=en-US",
             f"--user-data-dir={profile}", "--virtual-time-budget=12000", *args, url],
            capture_output=True, text=True, timeout=timeout, start_new_session=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if proc.returncode != 0:
        raise AssertionError(f"chromium {args} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def dump_dom(url):
    dom = chromium(["--dump-dom"], url)
    if "<body" not in dom:
        raise AssertionError(f"chromium --dump-dom gave no document:\n{dom[:2000]}")
    return Dom(dom)


def decode_png(data):
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + chunk) != struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]:
            raise AssertionError(f"PNG chunk {kind} has a bad CRC")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    if depth != 8 or color not in (2, 6) or interlace:
        raise AssertionError(f"PNG: depth {depth} colour type {color} interlace {interlace} not handled")
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, prev = [], bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif kind != 0:
            raise AssertionError(f"PNG: filter {kind}")
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def colour_counts(png):
    """{(r, g, b): pixels} of a PNG."""
    width, _, bpp, rows = decode_png(png)
    counts = {}
    for row in rows:
        for x in range(0, width * bpp, bpp):
            key = row[x:x + 3]
            counts[key] = counts.get(key, 0) + 1
    return {tuple(k): v for k, v in counts.items()}


class StatusPageTest(unittest.TestCase):
    def setUp(self):
        require_root(self)
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def assert_no_page_errors(self, dom):
        self.assertEqual(dom.attr("errors", "data-count"), "0", f"script errors on the page:\n{dom.text('errors')}")
        self.assertEqual(dom.text("errors").strip(), "")

    def assert_strict_headers(self, http):
        for path, content_type in (("/", "text/html; charset=utf-8"),
                                   ("/ui/status.js", "text/javascript; charset=utf-8"),
                                   ("/ui/chart.min.js", "text/javascript; charset=utf-8")):
            status, headers, body = get(http, path)
            self.assertEqual(status, 200, path)
            self.assertEqual(headers["Content-Type"], content_type, path)
            csp = headers["Content-Security-Policy"]
            self.assertIn("script-src 'self';", csp)
            self.assertNotIn("unsafe", csp)
            self.assertGreater(len(body), 1000, path)

    def test_live_collector_fed_by_the_demo(self):
        started = time.monotonic()
        fleet = DemoFleet(self.procs).start()
        fleet.wait_reports(4)
        http = fleet.collector_http
        self.assert_strict_headers(http)
        # The summary changes with every report (one each 2 s): poll it while
        # Chromium runs, so that the value the page fetched is among those seen.
        shares, done = [], threading.Event()

        def poll():
            while not done.is_set():
                shares.append(get_json(http, "/api/v1/summary?minutes=5")["tls_share"])
                done.wait(0.2)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            dom = dump_dom(f"http://{http}/")
        finally:
            done.set()
            poller.join()
        after = get_json(http, "/api/v1/summary?minutes=5")
        shares.append(after["tls_share"])
        agents = get_json(http, "/api/v1/agents")
        trend = get_json(http, "/api/v1/trend?minutes=60")

        self.assert_no_page_errors(dom)
        body = next(dom.find_all(dom.root, "body"))
        self.assertEqual(body["attrs"].get("data-state"), "ready", dom.text("notice"))
        # Loaded, then refreshed by itself (10 s of virtual time later).
        self.assertGreaterEqual(int(body["attrs"].get("data-refreshes", "0")), 2)
        self.assertIn("tlsprof — TLS CPU across the fleet", dom.text(next(dom.find_all(dom.root, "h1"))))
        self.assertIn("hidden", dom.by_id["notice"]["attrs"])

        # The big number: the share the page fetched, shown as a percentage,
        # within what the API said just before and just after.
        share = float(dom.attr("share", "data-value"))
        text = dom.text("share").strip()
        self.assertRegex(text, r"^\d+(\.\d+)? %$")
        self.assertAlmostEqual(float(text.split()[0]), share * 100, delta=0.051)
        self.assertGreater(share, 0)
        nearest = min(shares, key=lambda v: abs(v - share))
        self.assertAlmostEqual(share, nearest, delta=SHARE_TOLERANCE,
                               msg=f"page share {share} vs the API's during the load: {sorted(set(shares))}")

        # Charts: the demo's buckets and algorithms.
        points = {id_: int(dom.attr(id_, "data-points")) for id_ in ("buckets", "algorithms", "trend", "trend-buckets")}
        labels = {id_: json.loads(dom.attr(id_, "data-labels")) for id_ in points}
        for id_ in points:
            self.assertEqual(dom.attr(id_, "data-ready"), "1", id_)
            self.assertGreater(points[id_], 0, f"{id_}: no data points")
        api_buckets = {b["bucket"] for b in after["buckets"] if b["cpu_seconds"] > 0}
        self.assertLessEqual({"cipher", "signature", "key_exchange"}, set(labels["buckets"]))
        self.assertLessEqual(set(labels["buckets"]), api_buckets)
        self.assertEqual(points["buckets"], len(labels["buckets"]))
        self.assertLessEqual({"AES-GCM", "ChaCha20-Poly1305", "RSA"}, set(labels["algorithms"]))
        self.assertLessEqual(set(labels["algorithms"]), {a["algorithm"] for a in after["algorithms"]})
        self.assertGreaterEqual(points["trend"], 1)
        self.assertLessEqual(points["trend"], len(trend["points"]))
        self.assertLessEqual(set(labels["trend"]), {p["minute"] for p in trend["points"]})

        # The agents table: the demo's host, with the API's counts.
        rows = list(dom.find_all(dom.by_id["agents"], "tr"))[1:]  # minus the header row
        self.assertEqual(int(dom.attr("agents", "data-rows")), len(rows))
        hosts = [r["attrs"].get("data-host") for r in rows]
        self.assertIn(socket.gethostname(), hosts)
        self.assertEqual(hosts, [a["hostname"] for a in agents["agents"]])
        cells = [dom.text(td).strip() for td in dom.find_all(rows[0], "td")]
        self.assertEqual(cells[0], socket.gethostname())
        self.assertEqual(cells[1], f"insecure:{socket.gethostname()}")
        self.assertRegex(cells[2], r"^(just now|\d+ s ago)$")
        self.assertGreaterEqual(int(cells[3].replace(",", "")), 4)

        # The screenshot: a real PNG, kept, in which the charts are drawn.
        os.makedirs(OUTPUT_DIR, exist_ok=True)
        shot = os.path.abspath(os.path.join(OUTPUT_DIR, "status-page.png"))
        if os.path.exists(shot):
            os.unlink(shot)
        chromium([f"--screenshot={shot}", "--window-size=1280,1600"], f"http://{http}/")
        print(f"\nstatus page screenshot: {shot}", flush=True)
        with open(shot, "rb") as f:
            png = f.read()
        self.assertGreater(len(png), 30000, "the screenshot is suspiciously small")
        width, height = struct.unpack(">II", png[16:24])
        self.assertEqual((width, height), (1280, 1600))
        colours = colour_counts(png)
        self.assertGreater(len(colours), 200, "the screenshot has too few colours to hold text and charts")
        big = [b["bucket"] for b in after["buckets"] if b["share_of_tls"] >= 0.03]
        self.assertIn("cipher", big)
        for bucket in big:
            # A slice and bars of every bucket with 3% or more: at least a 10x10 patch of its colour.
            self.assertGreater(colours.get(BUCKET_COLORS[bucket], 0), 100, f"no {bucket} colour in the screenshot")
        print(f"status page test: {time.monotonic() - started:.1f} s, {len(colours)} colours, "
              f"share {share:.4f}, buckets {labels['buckets']}", flush=True)

    def test_collector_without_agents(self):
        grpc_port, http_port = free_port(), free_port()
        http = f"127.0.0.1:{http_port}"
        self.procs.start([COLLECTOR, "--insecure", "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen", http],
                         port=http_port)
        self.assert_strict_headers(http)
        self.assertEqual(get_json(http, "/api/v1/trend")["points"], [])
        agents = get_json(http, "/api/v1/agents")
        self.assertEqual({k: agents[k] for k in ("total", "truncated", "agents")},
                         {"total": 0, "truncated": False, "agents": []})
        self.assertEqual(get_json(http, "/api/v1/summary")["reports"], 0)
        for path, message in (("/api/v1/trend?minutes=61", "minutes: must be an integer 1-60, got '61'"),
                              ("/api/v1/agents?limit=x", "limit: must be an integer 1-1000, got 'x'")):
            with self.assertRaises(urllib.error.HTTPError) as e:
                get(http, path)
            self.assertEqual(e.exception.code, 400, path)
            self.assertEqual(json.loads(e.exception.read())["error"], message)

        dom = dump_dom(f"http://{http}/")
        self.assert_no_page_errors(dom)
        body = next(dom.find_all(dom.root, "body"))
        self.assertEqual(body["attrs"].get("data-state"), "empty")
        self.assertNotIn("hidden", dom.by_id["notice"]["attrs"])
        self.assertIn("no reports yet", dom.text("notice").lower())
        self.assertEqual(dom.text("share").strip(), "–")
        for id_ in ("buckets", "algorithms", "trend", "trend-buckets"):
            self.assertEqual(dom.attr(id_, "data-ready"), "1", id_)
            self.assertEqual(dom.attr(id_, "data-points"), "0", id_)
        self.assertEqual(dom.attr("agents", "data-rows"), "0")
        self.assertNotIn("hidden", dom.by_id["agents-empty"]["attrs"])


if __name__ == "__main__":
    unittest.main()
