"""Stack-aware attribution against ground truth on Go 1.19's crypto (the
go, go_stripped and go_crypto variants of test_stack_accuracy.py, the same
method and bounds). A module of its own so that the sanitizer pass, which
runs test_stack_accuracy.py's C and BoringSSL variants, stays shorter: the
agent's Go paths (.gopclntab symbols, pcsp unwind rows) are the same code
under ASan in symbols_test and unwind_test.

TLSPROF_SEEDS=a,b,c replays a run's seeds."""
import unittest

import test_stack_accuracy as accuracy


class GoStackAccuracyTest(accuracy.StackAccuracyCase):
    def test_go_crypto(self):
        self.run_variant("go")

    def test_go_crypto_stripped(self):
        self.run_variant("go_stripped")

    def test_go_crypto_without_crypto_tls(self):
        self.run_variant("go_crypto")


if __name__ == "__main__":
    unittest.main()
