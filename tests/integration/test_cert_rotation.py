"""Certificate rotation: the collector's certificate files are replaced while
it runs, and no report is lost.

A tlsprof-collector (mTLS, --tls-reload-seconds 1) takes tlsprof-loadgen's
windows; then its certificate and key are replaced on disk by a new pair from
the same CA (renamed into place, as a deployment tool would). The test
asserts that a new TLS connection is served the new certificate (its serial,
read with openssl s_client), that the loadgen's windows before and after are
all accepted, and that the collector counted every one of them.
"""
import os
import re
import subprocess
import time
import unittest

from prometheus_harness import metric_sum
from prometheus_harness import scrape
from test_two_collectors import RELAY, Collector, make_pki, run_loadgen
from tlsprof_testlib import Processes

BEFORE = {"seed": 11, "agents": 20, "series": 20, "prefix": "rot-a-"}
AFTER = {"seed": 12, "agents": 20, "series": 20, "prefix": "rot-b-"}
WINDOWS = 5  # run_loadgen's --total-windows


def served_serial(pki, address):
    """The serial of the certificate a new connection to `address` is served."""
    proc = subprocess.run(["openssl", "s_client", "-connect", address, "-CAfile", f"{pki}/ca.crt", "-cert",
                           f"{pki}/{RELAY}.crt", "-key", f"{pki}/{RELAY}.key", "-verify_return_error"],
                          input="", capture_output=True, text=True, timeout=20)
    m = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", proc.stdout, re.S)
    if not m:
        raise AssertionError(f"no certificate from {address}:\n{proc.stdout}\n{proc.stderr}")
    out = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=m.group(0), capture_output=True, text=True)
    return out.stdout.strip()


def issue_server_cert(pki, name):
    """A new collector certificate and key from the test CA: NAME.crt, NAME.key."""
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
                    f"{pki}/{name}.key"], check=True, capture_output=True)
    subprocess.run(["openssl", "req", "-new", "-key", f"{pki}/{name}.key", "-subj", "/CN=tlsprof-collector", "-out",
                    f"{pki}/{name}.csr"], check=True, capture_output=True)
    with open(f"{pki}/{name}.ext", "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    subprocess.run(["openssl", "x509", "-req", "-in", f"{pki}/{name}.csr", "-CA", f"{pki}/ca.crt", "-CAkey",
                    f"{pki}/ca.key", "-CAcreateserial", "-days", "30", "-sha256", "-extfile", f"{pki}/{name}.ext",
                    "-out", f"{pki}/{name}.crt"], check=True, capture_output=True)


class CertRotationTest(unittest.TestCase):
    def setUp(self):
        self.procs = Processes()
        self.addCleanup(self.procs.close)

    def test_a_replaced_certificate_is_served_to_new_connections_and_no_report_is_lost(self):
        pki = make_pki(self.procs)
        collector = Collector(self.procs, "rot", pki, extra=["--tls-reload-seconds", "1"])
        old = served_serial(pki, collector.address)
        first = run_loadgen(self, collector, BEFORE, pki)
        self.assertEqual(first["accepted"], BEFORE["agents"] * WINDOWS, first)

        issue_server_cert(pki, "collector-next")
        os.replace(f"{pki}/collector-next.key", f"{pki}/collector.key")
        os.replace(f"{pki}/collector-next.crt", f"{pki}/collector.crt")
        deadline = time.monotonic() + 30
        while (new := served_serial(pki, collector.address)) == old:
            if time.monotonic() > deadline:
                self.fail(f"the collector still serves {old} 30 s after its certificate was replaced")
            time.sleep(0.5)

        second = run_loadgen(self, collector, AFTER, pki)
        self.assertEqual(second["accepted"], AFTER["agents"] * WINDOWS, second)
        text = scrape(collector.metrics)
        self.assertEqual(metric_sum(text, "tlsprof_collector_reports_total", result="accepted"),
                         (BEFORE["agents"] + AFTER["agents"]) * WINDOWS, f"served {old}, then {new}")


if __name__ == "__main__":
    unittest.main()
