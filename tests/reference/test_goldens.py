"""Golden freshness: the committed goldens in tests/golden/ must be reproduced by the current
reference from the committed checkpoint (skipped while no goldens are committed).

Run: /usr/bin/python3 tests/reference/test_goldens.py
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(HERE), "golden")


class TestGoldensFresh(unittest.TestCase):
    @unittest.skipUnless(os.path.exists(os.path.join(GOLDEN, "MANIFEST.json")),
                         "no goldens committed yet")
    def test_goldens_reproduce(self):
        r = subprocess.run([sys.executable, os.path.join(HERE, "make_goldens.py"), "--check"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stdout)


if __name__ == "__main__":
    unittest.main()
