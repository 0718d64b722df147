"""Runs the Python package's unittest modules and reports as the rest of the suite does:
a line per test ("PASSED: ", "FAILED: ", "SKIPPED: <test>: <reason>") and Catch2's summary
line, which tests/tally.sh counts case by case ("All tests passed (N assertions in N test
cases)" or "test cases: N | P passed | F failed").

  runner.py MODULE...
"""
import sys
import time
import unittest


class CountingResult(unittest.TextTestResult):
    def addSuccess(self, test):
        super().addSuccess(test)
        print("PASSED: %s" % test.id(), flush=True)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        print("SKIPPED: %s: %s" % (test.id(), reason), flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        print("FAILED: %s" % test.id(), flush=True)

    def addError(self, test, err):
        super().addError(test, err)
        print("FAILED (error): %s" % test.id(), flush=True)


def main(modules):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    suite = unittest.TestSuite()
    for module in modules:
        suite.addTests(unittest.defaultTestLoader.loadTestsFromName(module))
    start = time.time()
    result = unittest.TextTestRunner(resultclass=CountingResult, verbosity=2,
                                     stream=sys.stdout).run(suite)
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print("%d test cases in %.1f s" % (total, time.time() - start))
    if total > 0 and failed == 0:
        print("All tests passed (%d assertions in %d test cases)" % (total, total))
    else:
        print("test cases: %d | %d passed | %d failed" % (total, total - failed, failed))
    return 0 if total > 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
