"""dashboards/*.json type-checked against Grafana's own model: @grafana/schema's
`Dashboard` type, with TypeScript's tsc (versions pinned in
dashboards/schema/package-lock.json, installed by `npm ci` into the build tree).

Each dashboard becomes `const dashboard: Dashboard = <its JSON>;`: an object
literal, so tsc checks every field's type and rejects unknown fields (excess
properties). tsc must pass on the real files, and fail, with the expected error
at the expected line, on copies broken one way each.
"""
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import time
import unittest

SRC = os.environ.get("TLSPROF_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARDS = os.path.join(SRC, "dashboards")
SCHEMA = os.path.join(DASHBOARDS, "schema")
# node_modules and the generated .ts files live in the build tree, never in the source tree.
WORK = os.environ.get("TLSPROF_SCHEMA_WORK", os.path.join(SRC, "build", "dashboards-schema"))
PROJECT_FILES = ("package.json", "package-lock.json", ".npmrc", "tsconfig.json")
NPM_TIMEOUT = 300
TSC_TIMEOUT = 120

HEADER = "import type { Dashboard } from '@grafana/schema';\n\n"
# The JSON's first line shares the declaration's line, so line N of the .ts file is line N - 2 of the JSON.
DECLARATION = "export const dashboard: Dashboard = "
LINE_OFFSET = HEADER.count("\n")
DIAGNOSTIC = re.compile(r"^(?P<file>[^()\s][^()]*)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")


def to_typescript(json_text):
    return HEADER + DECLARATION + json_text.rstrip() + ";\n"


def first_panel(d):
    return next(p for p in d["panels"] if p["type"] != "row")


def variable(d, kind):
    return next(v for v in d["templating"]["list"] if v["type"] == kind)


# name: (mutation of a parsed dashboard, tsc's code, message regex, text on the reported line or None)
BROKEN = {
    "gridpos_h_string": (lambda d: first_panel(d)["gridPos"].update(h="8"),
                         "TS2322", r"Type 'string' is not assignable to type 'number'", '"h": "8"'),
    "refresh_number": (lambda d: d.update(refresh=5),
                       "TS2322", r"Type 'number' is not assignable to type 'string'", '"refresh": 5'),
    "unknown_top_level_field": (lambda d: d.update(refersh="1m"),
                                "TS2353", r"'\"refersh\"' does not exist in type 'Dashboard'", '"refersh"'),
    "unknown_panel_field": (lambda d: first_panel(d).update(fieldconfig={}),
                            "TS2353", r"'\"fieldconfig\"' does not exist in type 'Panel", '"fieldconfig"'),
    "panel_without_type": (lambda d: first_panel(d).pop("type"),
                           "TS2322", r"Property 'type' is missing", None),
    "variable_type_misspelled": (lambda d: variable(d, "query").update(type="querry"),
                                 "TS2820", r"Type '\"querry\"' is not assignable to type 'VariableType'", '"querry"'),
    "schema_version_missing": (lambda d: d.pop("schemaVersion"),
                               "TS2741", r"Property 'schemaVersion' is missing", DECLARATION.strip()),
    # What dashboards exported by Grafana's UI carry and the schema rejects (the real files had both).
    "variable_definition": (lambda d: variable(d, "query").update(definition="label_values(up, job)"),
                            "TS2353", r"'\"definition\"' does not exist in type 'VariableModel'", '"definition"'),
    "variable_current_empty": (lambda d: variable(d, "datasource").update(current={}),
                               "TS2739", r"missing the following properties from type 'VariableOption': text, value",
                               '"current": {}'),
}


def run(argv, timeout, what):
    started = time.monotonic()
    try:
        p = subprocess.run(argv, cwd=WORK, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, npm_config_update_notifier="false"))
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{what}: `{' '.join(argv)}` did not finish in {timeout} s "
                             f"(is the npm registry reachable?)\n{e.stdout or ''}{e.stderr or ''}")
    print(f"{what}: {time.monotonic() - started:.1f} s")
    return p


def diagnostics(output):
    """[(file, line, code, message)] of tsc --pretty false's errors; a message's indented continuation lines
    (the elaboration: which property, which union member) are joined to it."""
    out = []
    for line in output.splitlines():
        m = DIAGNOSTIC.match(line)
        if m:
            out.append((m["file"], int(m["line"]), m["code"], m["msg"]))
        elif out and line.startswith(" "):
            f, n, code, msg = out[-1]
            out[-1] = (f, n, code, msg + " " + line.strip())
    return out


class GrafanaSchemaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool in ("node", "npm"):
            if shutil.which(tool) is None:
                raise AssertionError(f"{tool} not found: scripts/install-deps.sh installs nodejs (and npm where "
                                     "nodejs does not bring it)")
        os.makedirs(WORK, exist_ok=True)
        for name in PROJECT_FILES:
            shutil.copy(os.path.join(SCHEMA, name), os.path.join(WORK, name))
        # npm ci: exactly the lockfile's versions and integrity hashes, node_modules made afresh.
        p = run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund", "--fetch-retries=1",
                 "--fetch-timeout=60000"], NPM_TIMEOUT, "npm ci")
        if p.returncode != 0:
            raise AssertionError(f"npm ci failed (exit {p.returncode}) in {WORK}: this test installs typescript and "
                                 f"@grafana/schema from the npm registry, which must be reachable (or in npm's "
                                 f"cache)\n{p.stdout}{p.stderr}")
        cls.tsc_path = os.path.join(WORK, "node_modules", ".bin", "tsc")
        cls.paths = sorted(glob.glob(os.path.join(DASHBOARDS, "*.json")))
        if not cls.paths:
            raise AssertionError(f"no dashboards in {DASHBOARDS}")

    def write(self, subdir, name, text):
        directory = os.path.join(WORK, subdir)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name + ".ts")
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_tsc(self, project, what):
        return run([self.tsc_path, "-p", project, "--pretty", "false"], TSC_TIMEOUT, what)

    def test_installed_versions_are_the_lockfiles(self):
        with open(os.path.join(SCHEMA, "package-lock.json")) as f:
            lock = json.load(f)["packages"]
        for package in ("typescript", "@grafana/schema"):
            with open(os.path.join(WORK, "node_modules", package, "package.json")) as f:
                installed = json.load(f)["version"]
            self.assertEqual(installed, lock[f"node_modules/{package}"]["version"], package)

    def test_dashboards_pass(self):
        shutil.rmtree(os.path.join(WORK, "dashboards"), ignore_errors=True)
        for path in self.paths:
            with open(path) as f:
                self.write("dashboards", os.path.basename(path).removesuffix(".json"), to_typescript(f.read()))
        p = self.run_tsc("tsconfig.json", f"tsc on {len(self.paths)} dashboards")
        # The .ts line is the JSON's line + LINE_OFFSET: say where in the JSON each error is.
        errors = [f"dashboards/{os.path.basename(f).removesuffix('.ts')}.json:{line - LINE_OFFSET}: {code} {msg}"
                  for f, line, code, msg in diagnostics(p.stdout)]
        self.assertEqual(p.returncode, 0, "tsc rejects the dashboards against @grafana/schema's Dashboard:\n"
                         + "\n".join(errors or [p.stdout + p.stderr]))

    def test_broken_copies_fail(self):
        shutil.rmtree(os.path.join(WORK, "broken"), ignore_errors=True)
        with open(self.paths[0]) as f:
            original = json.load(f)
        texts = {}
        for name, (mutate, _, _, _) in BROKEN.items():
            d = copy.deepcopy(original)
            mutate(d)
            texts[name] = to_typescript(json.dumps(d, indent=2))
            self.write("broken", name, texts[name])
        with open(os.path.join(WORK, "tsconfig.broken.json"), "w") as f:
            json.dump({"extends": "./tsconfig.json", "include": ["broken/*.ts"]}, f)
        p = self.run_tsc("tsconfig.broken.json", f"tsc on {len(BROKEN)} broken copies")
        self.assertNotEqual(p.returncode, 0, "tsc accepted every broken copy")
        found = {}
        for f, line, code, msg in diagnostics(p.stdout):
            found.setdefault(os.path.basename(f).removesuffix(".ts"), []).append((line, code, msg))
        self.assertEqual(set(found), set(BROKEN), f"copies tsc found no error in, or unexpected ones:\n{p.stdout}")
        for name, (_, code, message, marker) in BROKEN.items():
            with self.subTest(name):
                # Exactly one error, the one the mutation makes, on the mutated line.
                self.assertEqual(len(found[name]), 1, found[name])
                line, got_code, msg = found[name][0]
                self.assertEqual(got_code, code, msg)
                self.assertRegex(msg, message)
                if marker is not None:
                    self.assertIn(marker, texts[name].splitlines()[line - 1])


if __name__ == "__main__":
    unittest.main()
