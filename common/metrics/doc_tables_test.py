"""docs/fleet.md's metric tables agree with the metric table (metric_table.h).

Every row of a docs table whose header is `| metric | type | labels | meaning |`
names metrics of the table, with its type and its label names; every metric
of the table has a row. A row's labels cell reads:
- `—`: no labels;
- `a, b (v1, v2), c`: label names, a parenthesis lists values (ignored);
- `…[, container_id, pod_uid]`: labels written only when set;
- `as `other_metric`` (and, for a histogram, `, le`): the other row's labels.
A meaning that says "agent only", "collector only" or "reserved" must match
the sides the table gives.

Environment: TLSPROF_METRIC_TABLE (the tlsprof-metric-table executable) and
TLSPROF_SRC (the source tree).
"""
import json
import os
import re
import subprocess
import unittest

SRC = os.environ.get("TLSPROF_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = [os.path.join(SRC, "docs", "fleet.md")]
HEADER = re.compile(r"^\|\s*metric\s*\|\s*type\s*\|\s*labels\s*\|\s*meaning\s*\|\s*$")


def load_table():
    exe = os.environ.get("TLSPROF_METRIC_TABLE") or os.path.join(SRC, "build", "bin", "tlsprof-metric-table")
    if not os.access(exe, os.X_OK):
        raise AssertionError(f"{exe}: not built; build the tlsprof-metric-table target, or set TLSPROF_METRIC_TABLE")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return {m["name"]: m for m in json.loads(out)["metrics"]}


def doc_rows(path):
    """(line number, [names], type, labels cell, meaning) of every metric table row."""
    rows = []
    in_table = False
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if HEADER.match(line):
                in_table = True
                continue
            if not line.startswith("|"):
                in_table = False
                continue
            if not in_table or set(line) <= set("|-: "):
                continue
            # Split on cell bars, not on escaped ones (`\|` inside a cell).
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            names = re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[0])
            rows.append((n, names, cells[1], cells[2], cells[3]))
    return rows


def parse_labels(cell, labels_of):
    """(labels, only_when_set) of a labels cell; labels_of(name) resolves `as `name``."""
    cell = cell.strip()
    if cell in ("—", "-", ""):
        return [], []
    optional = []
    m = re.search(r"\[,([^\]]*)\]", cell)
    if m:
        optional = [x.strip() for x in m.group(1).split(",") if x.strip()]
        cell = cell[:m.start()] + cell[m.end():]
    cell = re.sub(r"\([^)]*\)", "", cell)
    labels = []
    for part in (p.strip() for p in cell.split(",")):
        if not part:
            continue
        ref = re.fullmatch(r"as `([a-z_:][a-z0-9_:]*)`", part)
        if ref:
            base, base_optional = labels_of(ref.group(1))
            labels += [x for x in base if x not in base_optional]
            optional += base_optional
        else:
            labels.append(part)
    return labels + optional, optional


class DocTablesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.table = load_table()

    def rows(self):
        for path in DOCS:
            for row in doc_rows(path):
                yield (os.path.relpath(path, SRC),) + row

    def test_every_documented_metric_is_in_the_table_with_its_type_and_labels(self):
        documented = {}
        for path, n, names, type_, labels_cell, meaning in self.rows():
            for name in names:
                documented[name] = (labels_cell, f"{path}:{n}")

        def labels_of(name):
            if name not in documented:
                raise AssertionError(f"a labels cell refers to {name}, which no table row documents")
            return parse_labels(documented[name][0], labels_of)

        seen = 0
        for path, n, names, type_, labels_cell, meaning in self.rows():
            self.assertTrue(names, f"{path}:{n}: a row without a metric name")
            labels, optional = parse_labels(labels_cell, labels_of)
            if type_ == "histogram":
                labels = [x for x in labels if x != "le"]
            for name in names:
                seen += 1
                with self.subTest(metric=name, where=f"{path}:{n}"):
                    self.assertIn(name, self.table, "documented but not in common/metrics/metric_table.h")
                    m = self.table[name]
                    self.assertEqual(type_, m["type"], "type")
                    self.assertEqual(sorted(labels), sorted(m["labels"]), "label names")
                    self.assertEqual(sorted(optional), sorted(m["only_when_set"]),
                                     "labels written only when set: [, ...] in the docs")
                    if "collector only" in meaning:
                        self.assertEqual(m["sides"], ["collector"], "the docs say collector only")
                    if "agent only" in meaning:
                        self.assertEqual(m["sides"], ["agent"], "the docs say agent only")
                    if meaning.startswith("reserved"):
                        self.assertEqual(m["sides"], [], "the docs say reserved")
        self.assertGreater(seen, 40, "the docs' metric tables were not found")

    def test_every_metric_of_the_table_is_documented(self):
        documented = {name for row in self.rows() for name in row[2]}
        missing = sorted(set(self.table) - documented)
        self.assertFalse(missing, "in the metric table but in no docs/fleet.md metric table")

    def test_each_metric_is_documented_once(self):
        names = [name for row in self.rows() for name in row[2]]
        self.assertEqual(sorted(n for n in set(names) if names.count(n) > 1), [])

    def test_label_cell_parser(self):
        def no_refs(name):
            raise AssertionError(name)
        self.assertEqual(parse_labels("—", no_refs), ([], []))
        self.assertEqual(parse_labels("result (a, b), what", no_refs), (["result", "what"], []))
        self.assertEqual(parse_labels("service, library[, container_id, pod_uid]", no_refs),
                         (["service", "library", "container_id", "pod_uid"], ["container_id", "pod_uid"]))
        self.assertEqual(parse_labels("as `x`, le", lambda n: (["a", "c"], ["c"])), (["a", "le", "c"], ["c"]))


if __name__ == "__main__":
    unittest.main()
