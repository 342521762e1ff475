"""The pure-Python fallback (FASTDATA_DISABLE_NATIVE=1) passes the drop-in suite too.

Run in a subprocess, since the choice is made once at import."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


# The whole drop-in suite runs inside this one test: more than the default limit.
@pytest.mark.timeout(600)
def test_dropin_suite_passes_on_the_python_fallback():
    env = {**os.environ, "FASTDATA_DISABLE_NATIVE": "1", "OMP_NUM_THREADS": "1"}
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(tests / "backends" / "test_dropin.py"), str(tests / "unit" / "test_collate.py")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
