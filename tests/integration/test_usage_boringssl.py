"""Usage telemetry (issue 4) on BoringSSL: `tlsprof-agent profile --usage` on
two tlsprof-boringssl-server processes (Debian's stripped android
libssl.so.0/libcrypto.so.0), one with an RSA-2048 and one with an ECDSA
P-256 certificate, under a scripted `openssl s_client` mix whose every
handshake is known: TLS 1.3 AES-GCM with X25519, TLS 1.3 ChaCha20 with
P-256, TLS 1.2 ECDHE-RSA-AES128-SHA, a TLS 1.3 session resumed (with its own
X25519 exchange) and a TLS 1.2 ticket resumed (no exchange). The counts by
kind, version, cipher suite, group and certificate key type must be exact,
and so must the signatures (EVP_PKEY_sign) and X25519 key exchanges, each
timed on-CPU; connections held open through the report are live."""
import collections
import os
import time
import unittest

from tlsprof_testlib import BIN, USAGE_MIX, USAGE_SESSIONS, UsageAgentTestCase

SERVER = os.path.join(BIN, "tlsprof-boringssl-server")
PROFILE_SECONDS = 20
RESUMED = 3  # resumptions of each of the two sessions (each after its full handshake)
HELD_OPEN = 2  # connections still open when the report is written

# The shared mix (TLS 1.3 AES-GCM X25519 and ChaCha20 P-256 on the ECDSA
# server, TLS 1.2 ECDHE-RSA-AES128-SHA on the RSA one), and TLS 1.3 with
# P-256 on the RSA server. On P-256 BoringSSL's key share derives with no
# probed function: the group is the library's own answer (SSL_get_curve_id).
MIX = USAGE_MIX + [
    ("rsa", 2, ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-groups", "P-256",
                "-sigalgs", "rsa_pss_rsae_sha256"],
     ("full", "TLSv1.3", "TLS_AES_128_GCM_SHA256", "P-256", "RSA")),
]
# Python's ssl client (OpenSSL 3's defaults) against BoringSSL, which takes
# the client's first suite: TLS 1.3 AES-256-GCM with X25519.
HELD_ROW = ("full", "TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519", "RSA")


class BoringSslUsageTest(UsageAgentTestCase):
    def start_servers(self):
        """The RSA and the ECDSA server: cert -> (process, port)."""
        servers = {}
        for cert in ("rsa", "ecdsa"):
            ready = self.procs.path(f"boringssl-{cert}.ready")
            proc = self.procs.start([SERVER, "--cert", cert, "--port", "0", "--ready-file", ready], ready_file=ready)
            with open(ready) as f:
                servers[cert] = (proc, int(f.read().strip().rsplit(":", 1)[1]))
        return servers

    def test_scripted_mix_is_counted_exactly(self):
        servers = self.start_servers()
        agent, report_path, log_path = self.start_agent("boringssl", [str(p.pid) for p, _ in servers.values()],
                                                        PROFILE_SECONDS, probed="libssl.so.0")
        started = time.monotonic()
        want = self.run_usage_mix({cert: port for cert, (_, port) in servers.items()}, MIX, USAGE_SESSIONS, RESUMED,
                                  request=b"x", answer=None)
        # Connections held open through the report: live (the server waits
        # for their byte; everything above was closed, SSL_free'd).
        ops, files = self.check_mix_report(agent, report_path, log_path, servers, want, started, PROFILE_SECONDS,
                                           "libssl.so.0", HELD_OPEN, HELD_ROW)
        # A full handshake signs once (TLS 1.3 CertificateVerify, TLS 1.2
        # ServerKeyExchange); every X25519 handshake but a TLS 1.2
        # resumption runs X25519() once; P-256 exchanges are not timed.
        self.assertEqual(ops, collections.Counter({
            ("ecdsa", "sign", "ECDSA-P256"): 5 + 3 + 1,
            ("ecdsa", "key_exchange", "X25519"): 5 + 1,
            ("rsa", "sign", "RSA-2048"): 4 + 2 + 1 + HELD_OPEN,
            ("rsa", "key_exchange", "X25519"): 4 + 1 + RESUMED + HELD_OPEN,
        }))

        self.assertEqual(files["libssl.so.0"]["functions"], ["SSL_do_handshake", "SSL_free"])
        self.assertEqual(files["libcrypto.so.0"]["functions"],
                         ["EVP_PKEY_sign", "EVP_PKEY_verify", "EVP_PKEY_derive", "X25519"])
        for f in files.values():
            self.assertEqual(f["fields"]["ssl.in_init"], "+0x30 -> +0x110 -> +0x618 (1 bytes) bit 3 == 0")


if __name__ == "__main__":
    unittest.main()
