"""The signal guard (tests/signal_guard.py): a test file whose fixtures or imports leave Ctrl-C ignored fails, named,
and the files after it run with Ctrl-C's default action again; a suite started with Ctrl-C ignored gives it back."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .pytester_support import conftest_loading
from .signal_guard import STATUS, held, put_back

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.skipif(not STATUS.exists(), reason="reads the kernel's view from /proc (Linux)")

GUARD = Path(__file__).resolve().parent / "signal_guard.py"
CONFTEST = conftest_loading(GUARD, "guard") + '''signal_dispositions_kept = guard.signal_dispositions_kept
'''
LEAVES_IT_IGNORED = '''
import ctypes, signal, pytest

@pytest.fixture(scope="module", autouse=True)
def native_library():
    ctypes.CDLL(None).signal(signal.SIGINT, 1)  # SIG_IGN, the way a native library sets it: Python's table unchanged
    yield

def test_one():
    pass
'''
LATER = '''
import signal

def test_ctrl_c_is_not_ignored_here():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    assert not int(status["SigIgn"], 16) >> (signal.SIGINT - 1) & 1
'''


def test_a_file_that_leaves_ctrl_c_ignored_fails_named_and_the_next_runs_as_alone(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a_native=LEAVES_IT_IGNORED, test_b_later=LATER)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_a_native.py left the test process with ignored SIGINT*"])


def test_the_kernels_view_sees_what_pythons_table_does_not():
    before = held()
    handler = signal.getsignal(signal.SIGINT)
    libc_signal = ctypes.CDLL(None).signal
    libc_signal.restype = ctypes.c_void_p  # the previous handler: a pointer, whatever Python had installed
    previous = libc_signal(signal.SIGINT, 1)  # SIG_IGN
    try:
        assert signal.getsignal(signal.SIGINT) is handler  # Python's table did not notice
        after = held()
        assert signal.SIGINT in after["ignored"] - before["ignored"]
        put_back(before, after)
        assert held() == before
    finally:
        if signal.SIGINT in held()["ignored"]:
            libc_signal(signal.SIGINT, ctypes.c_void_p(previous))
        signal.signal(signal.SIGINT, handler)


def test_a_suite_started_with_ctrl_c_ignored_gives_it_back(tmp_path):
    """What a shell's background job or a CI runner may hand pytest: the suite's processes (and every command its
    tests start) get Ctrl-C's default action back, and the header says so."""
    (tmp_path / "test_x.py").write_text(LATER)
    (tmp_path / "conftest.py").write_text(CONFTEST + "\ndef pytest_configure(config):\n    guard.started_ignoring()\n")
    done = subprocess.run(["bash", "-c",
                           f'trap "" INT; exec {sys.executable} -m pytest -q -p no:randomly -p no:cacheprovider'],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
