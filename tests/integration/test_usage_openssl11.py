"""Usage telemetry (issue 4) on OpenSSL 1.1: `tlsprof-agent profile --usage`
on two `openssl s_server -www` of Debian 11's OpenSSL 1.1.1w (stripped
libssl.so.1.1/libcrypto.so.1.1, unpacked by scripts/install-deps.sh into
/opt/tlsprof-openssl-1.1), one with an RSA-2048 and one with an ECDSA P-256
certificate, under the scripted `openssl s_client` mix of the other usage
tests (TLS 1.3 AES-GCM with X25519, TLS 1.3 ChaCha20 with P-256, TLS 1.2
ECDHE-RSA-AES128-SHA, a TLS 1.3 session and a TLS 1.2 session resumed). The
client is Debian 12's own `openssl` (OpenSSL 3, another library file): the
report is per process, and only the servers are profiled. The counts by
kind, version, cipher suite, group and certificate key type must be exact,
and so must the signatures and key exchanges, each timed on-CPU; a
connection held open through the report is live."""
import collections
import os
import time
import unittest

from tlsprof_testlib import USAGE_MIX, USAGE_SESSIONS, UsageAgentTestCase, free_port

ROOT = "/opt/tlsprof-openssl-1.1"
LIBS = os.path.join(ROOT, "usr/lib/x86_64-linux-gnu")
OPENSSL = os.path.join(ROOT, "usr/bin/openssl")
PROFILE_SECONDS = 20
RESUMED = 3  # resumptions of each of the two sessions (each after its full handshake)
# Python's ssl client (OpenSSL 3's defaults) against s_server, which takes
# the client's first suite: TLS 1.3 AES-256-GCM with X25519.
HELD_ROW = ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA")


class OpenSsl11UsageTest(UsageAgentTestCase):
    def start_servers(self):
        """1.1's s_server with an RSA and with an ECDSA certificate: cert -> (process, port)."""
        for path in (OPENSSL, os.path.join(LIBS, "libssl.so.1.1")):
            if not os.path.exists(path):
                self.fail(f"{path} is missing: OpenSSL 1.1 (Debian 11's libssl1.1 and openssl) is unpacked there "
                          "by scripts/install-deps.sh (as root)")
        servers = {}
        for cert in ("rsa", "ecdsa"):
            cert_pem, key_pem = self.make_cert(f"certs-{cert}", cert)
            port = free_port()
            proc = self.procs.start([OPENSSL, "s_server", "-accept", str(port), "-cert", cert_pem,
                                     "-key", key_pem, "-www", "-quiet"], port=port,
                                    env={**os.environ, "LD_LIBRARY_PATH": LIBS})
            servers[cert] = (proc, port)
        return servers

    def test_scripted_mix_is_counted_exactly(self):
        servers = self.start_servers()
        agent, report_path, log_path = self.start_agent("openssl11", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="libssl.so.1.1")
        started = time.monotonic()
        want = self.run_usage_mix({cert: port for cert, (_, port) in servers.items()}, USAGE_MIX, USAGE_SESSIONS,
                                  RESUMED, answer=b"HTTP/1.0 200")
        # A connection held open through the report: live (s_server -www
        # waits for its request; every other one was answered and freed).
        # One only: s_server serves one connection at a time.
        ops, files = self.check_mix_report(agent, report_path, log_path, servers, want, started, PROFILE_SECONDS,
                                           "libssl.so.1.1", 1, HELD_ROW)
        # A full handshake signs once (TLS 1.3 CertificateVerify, TLS 1.2
        # ServerKeyExchange) and derives once (EVP_PKEY_derive, P-256 as well
        # as X25519); a TLS 1.3 resumption derives, a TLS 1.2 one neither.
        self.assertEqual(ops, collections.Counter({
            ("ecdsa", "sign", "ECDSA-P256"): 5 + 3 + 1,
            ("ecdsa", "key_exchange", "X25519"): 5 + 1,
            ("ecdsa", "key_exchange", "ECDHE-P256"): 3,
            ("rsa", "sign", "RSA-2048"): 4 + 1 + 1,
            ("rsa", "key_exchange", "X25519"): 4 + 1 + RESUMED + 1,
        }))

        # The state machine found through the method tables, past 1.1.1's
        # inlined error-state test.
        self.assertEqual(files["libssl.so.1.1"]["functions"], ["state_machine", "SSL_free"])
        self.assertEqual(files["libcrypto.so.1.1"]["functions"],
                         ["EVP_DigestSign", "EVP_PKEY_sign", "EVP_DigestVerify", "EVP_PKEY_verify", "EVP_PKEY_derive"])
        for f in files.values():
            self.assertEqual(f["fields"]["ssl.key_type"], "+0x490 -> +0x0 -> +0x8 -> +0x0 (4 bytes)")


if __name__ == "__main__":
    unittest.main()
