"""Runs integration tests with unittest, verbosely, and prints each test's wall time.

Usage: run.py MODULE[.Class[.test]]...   (what CTest runs: tests/CMakeLists.txt)

The same as `python3 -m unittest -v MODULE...`, plus one line per test, "took: SECONDS TEST_ID", which
scripts/test-summary.py reads for the slowest test methods, and which shows where an integration test spends its
time when it is split or shortened.
"""
import sys
import time
import unittest


class TimedResult(unittest.TextTestResult):
    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.stream.writeln(f"took: {time.monotonic() - self._started:.1f} {test.id()}")
        self.stream.flush()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
    unittest.main(module=None, argv=[sys.argv[0], *sys.argv[1:]], testRunner=runner)
