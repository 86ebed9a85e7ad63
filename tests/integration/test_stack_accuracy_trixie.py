"""Stack-aware attribution against ground truth on Debian 13's OpenSSL 3.5,
the same method and bounds as test_stack_accuracy.py, with
ML-KEM-768 and ML-DSA-65 in the seeded draw. The ground truth is built inside
the trixie root with its own g++ and OpenSSL (trixie.build_groundtruth) and
runs there as a container:

  trixie_static   libcrypto.a linked in (full .symtab), after pivot_root
  trixie_shared   the root's stripped libcrypto.so.3, its libcrypto.a beside
                  it, in a plain chroot
  trixie_shared_hidden  the same with the archive hidden (private mount
                  namespace), after pivot_root: named from the library's tables
  trixie_go       Go 1.24's crypto (the Go ground truth built by the root's
                  Go, ML-KEM-768 in the draw), with symbols, in a plain chroot
  trixie_go_stripped  the same linked with -s -w, after pivot_root

TLSPROF_SEEDS=a,b,c replays a run's seeds."""
import unittest

import test_stack_accuracy as accuracy


class TrixieStackAccuracyTest(accuracy.StackAccuracyCase):
    def test_openssl35_static(self):
        self.run_variant("trixie_static")

    def test_openssl35_shared_with_archive(self):
        self.run_variant("trixie_shared")

    def test_openssl35_shared_hidden_archive(self):
        self.run_variant("trixie_shared_hidden")

    def test_go124(self):
        self.run_variant("trixie_go")

    def test_go124_stripped(self):
        self.run_variant("trixie_go_stripped")


if __name__ == "__main__":
    unittest.main()
