"""Static checks of the Grafana dashboards in dashboards/ (no server needed).

- every file parses, has a current schemaVersion, a `datasource` variable of
  type datasource for Prometheus, and no hard-coded host or instance;
- panel ids are unique, every panel has a title, every panel and target uses
  the datasource variable, and panels do not overlap on the 24-column grid;
- every PromQL expression parses: each one (template variables substituted
  as Grafana would) becomes a recording rule in a temporary file that
  `promtool check rules` must accept (promtool 2.42 has no expression checker);
- every metric that a panel, a recording rule or an alert
  (dashboards/prometheus/tlsprof-rules.yml), or a rules unit test's input or
  expression (dashboards/prometheus/*.test.yml) reads is in the metric table
  (common/metrics/metric_table.h, read as JSON from tlsprof-metric-table:
  TLSPROF_METRIC_TABLE) or recorded by the rules file.

The end-to-end test (tests/integration/test_dashboards.py) runs the same
queries against a real Prometheus.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

SRC = os.environ.get("TLSPROF_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARDS = os.path.join(SRC, "dashboards")
RULES = os.path.join(DASHBOARDS, "prometheus", "tlsprof-rules.yml")
RULES_TESTS = sorted(glob.glob(os.path.join(DASHBOARDS, "prometheus", "*.test.yml")))
PROMTOOL = os.environ.get("TLSPROF_PROMTOOL") or shutil.which("promtool") or "/usr/bin/promtool"

# Values Grafana substitutes for its built-in variables, and for ours.
BUILTINS = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
                "bool", "inf", "nan", "le"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def load_dashboards():
    paths = sorted(glob.glob(os.path.join(DASHBOARDS, "*.json")))
    if not paths:
        raise AssertionError(f"no dashboards in {DASHBOARDS}")
    out = {}
    for path in paths:
        with open(path) as f:
            out[os.path.basename(path)] = json.load(f)
    return out


def all_panels(dashboard):
    """Top-level panels and the panels of collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def targets(dashboard):
    """(panel, target) for every query target."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def substitute(expr, variables):
    """The expression as Grafana sends it: $name / ${name} / [[name]] replaced."""
    values = dict(BUILTINS)
    values.update(variables)

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", repl, expr)


def variable_values(dashboard):
    """A value per template variable: '.*' for multi/All, else its default."""
    values = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "datasource":
            values[var["name"]] = "prometheus"
        elif var.get("includeAll"):
            values[var["name"]] = var.get("allValue") or ".*"
        else:
            values[var["name"]] = var.get("current", {}).get("value") or "x"
    return values


def metric_names(expr):
    """Metric names an expression selects (a conservative lexer, not a parser)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)        # strings
    e = re.sub(r"\{[^}]*\}", "", e)                      # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                     # range / subquery durations
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\boffset\s+\w+", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*(\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in PROMQL_WORDS or re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names


def metric_table():
    """The metric table, as tlsprof-metric-table prints it: {name: entry}."""
    exe = os.environ.get("TLSPROF_METRIC_TABLE") or os.path.join(SRC, "build", "bin", "tlsprof-metric-table")
    if not os.access(exe, os.X_OK):
        raise AssertionError(f"{exe}: not built; build the tlsprof-metric-table target, or set TLSPROF_METRIC_TABLE")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return {m["name"]: m for m in json.loads(out)["metrics"]}


def rule_records():
    with open(RULES) as f:
        return {r["record"] for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "record" in r}


def known_metrics(table):
    """What an expression may read: the table's metrics (a histogram's
    series too), the rules file's records, and Prometheus' own `up`."""
    names = {"up"} | rule_records()
    for name, m in table.items():
        names.add(name)
        if m["type"] == "histogram":
            names.update(name + s for s in HISTOGRAM_SUFFIXES)
    return names


def rule_expressions():
    """(where, expr) of every recording rule and alert, and of every rules
    unit test's input series and PromQL check."""
    out = []
    with open(RULES) as f:
        for g in yaml.safe_load(f)["groups"]:
            for r in g["rules"]:
                out.append((f"{os.path.basename(RULES)}: {r.get('record') or r.get('alert')}", str(r["expr"])))
    for path in RULES_TESTS:
        with open(path) as f:
            for i, t in enumerate(yaml.safe_load(f)["tests"]):
                where = f"{os.path.basename(path)}: test {i}"
                out += [(where, s["series"]) for s in t.get("input_series", [])]
                out += [(where, e["expr"]) for e in t.get("promql_expr_test", [])]
    return out


class DashboardJsonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dashboards = load_dashboards()

    def test_schema_and_datasource_variable(self):
        uids = set()
        for name, d in self.dashboards.items():
            with self.subTest(dashboard=name):
                self.assertGreaterEqual(d.get("schemaVersion", 0), 36, "use a current schemaVersion")
                self.assertTrue(d.get("title"))
                self.assertNotIn(d.get("uid"), uids, "dashboard uids must be unique")
                uids.add(d.get("uid"))
                ds = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
                self.assertEqual(len(ds), 1, "one datasource variable")
                self.assertEqual(ds[0]["name"], "datasource")
                self.assertEqual(ds[0]["query"], "prometheus")
                for var in d["templating"]["list"]:
                    if var["type"] == "query":
                        self.assertEqual(var["datasource"]["uid"], "${datasource}", var["name"])
                        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                        self.assertRegex(query, r"^label_values\(", f"{var['name']}: built from label_values")

    def test_panels_have_unique_ids_and_titles(self):
        for name, d in self.dashboards.items():
            with self.subTest(dashboard=name):
                ids = [p.get("id") for p in all_panels(d)]
                self.assertTrue(all(isinstance(i, int) for i in ids), ids)
                self.assertEqual(len(ids), len(set(ids)), f"duplicate panel ids: {sorted(ids)}")
                for p in all_panels(d):
                    self.assertTrue(p.get("title", "").strip(), f"panel {p.get('id')} has no title")

    def test_every_panel_and_target_uses_the_datasource_variable(self):
        for name, d in self.dashboards.items():
            n = 0
            for panel in all_panels(d):
                if panel["type"] == "row":
                    self.assertFalse(panel.get("targets"), f"{name}: row {panel['title']!r} has targets")
                    continue
                with self.subTest(dashboard=name, panel=panel["title"]):
                    self.assertEqual(panel.get("datasource", {}).get("uid"), "${datasource}")
                    self.assertTrue(panel.get("targets"), "panel without a query")
                    for t in panel["targets"]:
                        self.assertEqual(t.get("datasource", {}).get("uid"), "${datasource}", t.get("refId"))
                        self.assertEqual(t["datasource"].get("type"), "prometheus")
                        self.assertTrue(t.get("expr", "").strip(), "empty expression")
                        n += 1
            self.assertGreater(n, 0, name)

    def test_no_hard_coded_hosts(self):
        for name, d in self.dashboards.items():
            for panel, t in targets(d):
                for label, value in re.findall(r'\b(host|instance|hostname)\s*=~?\s*"([^"]*)"', t["expr"]):
                    self.assertTrue(value.startswith("$"), f"{name}: {panel['title']}: {label}={value!r}")

    def test_grid_positions_do_not_overlap(self):
        for name, d in self.dashboards.items():
            boxes = []
            for p in d["panels"]:
                g = p["gridPos"]
                with self.subTest(dashboard=name, panel=p["title"]):
                    self.assertGreaterEqual(g["x"], 0)
                    self.assertGreaterEqual(g["y"], 0)
                    self.assertGreater(g["w"], 0)
                    self.assertGreater(g["h"], 0)
                    self.assertLessEqual(g["x"] + g["w"], 24, "wider than the 24-column grid")
                for q, h in boxes:
                    overlap = (g["x"] < h["x"] + h["w"] and h["x"] < g["x"] + g["w"] and
                               g["y"] < h["y"] + h["h"] and h["y"] < g["y"] + g["h"])
                    self.assertFalse(overlap, f"{name}: {p['title']!r} overlaps {q!r}")
                boxes.append((p["title"], g))

    def test_expressions_parse(self):
        if not os.access(PROMTOOL, os.X_OK):
            self.fail(f"promtool not found ({PROMTOOL}): install Debian's prometheus package "
                      "(scripts/install-deps.sh)")
        rules = []
        for name, d in self.dashboards.items():
            values = variable_values(d)
            for panel, t in targets(d):
                rules.append((f"{name}: {panel['title']} ({t['refId']})", substitute(t["expr"], values)))
            for var in d["templating"]["list"]:
                if var["type"] == "query":
                    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
                    self.assertIsNotNone(m, query)
                    rules.append((f"{name}: variable {var['name']}", substitute(m.group(1), values)))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "exprs.yml")
            # JSON is YAML: one recording rule per expression.
            with open(path, "w") as f:
                json.dump({"groups": [{"name": "exprs", "rules": [
                    {"record": f"dashboard_expr_{i}", "expr": e} for i, (_, e) in enumerate(rules)]}]}, f)
            proc = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
            if proc.returncode != 0:
                detail = "\n".join(f"  dashboard_expr_{i}: {what}: {e}" for i, (what, e) in enumerate(rules))
                self.fail(f"promtool rejects a dashboard expression:\n{proc.stdout}{proc.stderr}\n{detail}")
        self.assertGreater(len(rules), 20)

    def test_panels_read_metrics_of_the_table_or_recorded(self):
        known = known_metrics(metric_table())
        self.assertIn("tlsprof_cpu_seconds_total", known)
        self.assertIn("tlsprof_handshake_cpu_seconds_total", known)
        self.assertIn("job:tlsprof_tls_share:ratio_rate5m", known)
        for name, d in self.dashboards.items():
            for panel, t in targets(d):
                used = metric_names(t["expr"])
                with self.subTest(dashboard=name, panel=panel["title"], expr=t["expr"]):
                    self.assertTrue(used, "no metric found in the expression")
                    self.assertFalse(used - known, "metrics neither in the metric table nor recorded by the rules")

    def test_rules_read_metrics_of_the_table_or_recorded(self):
        known = known_metrics(metric_table())
        exprs = rule_expressions()
        self.assertGreater(len(exprs), 50, "the rules and their tests were not found")
        for where, expr in exprs:
            used = metric_names(expr)
            with self.subTest(where=where, expr=expr):
                self.assertTrue(used, "no metric found in the expression")
                self.assertFalse(used - known, "metrics neither in the metric table nor recorded by the rules")

    def test_metric_name_lexer(self):
        # The lexer the previous test relies on finds what it must and nothing else.
        self.assertEqual(metric_names('histogram_quantile(0.99, sum by (instance, le) '
                                      '(rate(tlsprof_collector_ingest_seconds_bucket{job="$j"}[5m])))'),
                         {"tlsprof_collector_ingest_seconds_bucket"})
        self.assertEqual(metric_names('a:b:c{job="x"} / on (job) group_left sum by (job) (d_total offset 1d) '
                                      'or vector(0) and time() - e > 0.5'), {"a:b:c", "d_total", "e"})

    def test_rules_file_records_what_the_dashboards_read(self):
        # The dashboards lean on recording rules: a renamed record must not go unnoticed.
        records = rule_records()
        used = set()
        for d in self.dashboards.values():
            for _, t in targets(d):
                used |= {m for m in metric_names(t["expr"]) if ":" in m}
        self.assertTrue(used, "no dashboard uses a recording rule")
        self.assertFalse(used - records, "recording rules the dashboards use but the rules file lacks")


if __name__ == "__main__":
    unittest.main()
