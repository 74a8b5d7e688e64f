"""A test that its timeout cannot end (its main thread never returns to Python to run SIGALRM's handler) is named,
its stacks printed and its test process ended; the new test process fails it at once rather than hang again, and
the rest of the run goes on (tests/watchdog.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two xdist test processes start (~5 s each on a busy machine)

REPO_ROOT = Path(__file__).resolve().parent.parent

HANGS = '''
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_hangs_where_its_timeout_cannot_reach():
    # SIGALRM blocked in the main thread: pytest-timeout's signal lands elsewhere, the sleep is never interrupted
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)

def test_after_it():
    assert True
'''
OTHER = """
def test_a():
    pass

def test_b():
    pass
"""


def test_a_hung_test_is_named_failed_once_and_the_file_goes_on(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGS)
    for name in ("test_other1.py", "test_other2.py"):  # with more files than processes, xdist hands it out again
        (tmp_path / name).write_text(OTHER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "KVMESH_TEST_WATCHDOG_GRACE_S": "2", "KVMESH_TEST_WATCHDOG_REPORT_S": "1",
           "KVMESH_TEST_RUN_DIR": ""}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.watchdog",
                          "-n", "2", "--dist", "loadfile", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
                          str(tmp_path), str(tmp_path)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=100)
    output = run.stdout + run.stderr
    assert time.monotonic() - started < 60, output  # not the 120 s sleep, nor twice it
    assert run.returncode == 1, output
    assert "[watchdog] " in output and "test_hangs_where_its_timeout_cannot_reach still running after 3 s" in output
    assert "in test_hangs_where_its_timeout_cannot_reach" in output  # the main thread's stack, naming the function
    # the process printing the dots named it while it ran
    assert re.search(r"\[watchdog\] still running after \d+ s: \S*test_hang.py::test_hangs_where", output), output
    assert "not run again" in output, output  # handed to the new process, it failed at once
    assert output.count("(its timeout did not end it)") == 1, output  # and hung nothing more
    assert "1 failed, 5 passed, 1 error" in output, output
