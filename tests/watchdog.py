"""A hung test is named and failed, and the suite goes on without it.

pytest-timeout (``timeout`` in pyproject.toml, its signal method) fails a test that runs too long by raising in the
main thread from SIGALRM's handler. A test whose main thread is stuck inside native code never returns to Python to
run that handler, and then nothing ends it: its test process waits until CI's own limit, and the suite's summary,
which would say what was slow, is never printed. Three guards here:

- **The test process** (each of ``make test``'s, or the only one) watches its running test from a thread. Past the
  test's own timeout plus ``GRACE_S``, it prints every thread's stack under a line naming the test, writes the test's
  id to the run's hung list and ends itself (``os._exit``). pytest-xdist reports the test as crashed and starts a new
  test process for the rest of that file.
- **A test on the hung list**, should a scheduler hand a crashed test to the new process again, fails at once,
  saying so, rather than hanging a second process.
- **The process that prints the dots** (xdist's controller) names any test still running after
  ``REPORT_AFTER_S`` and again at each doubling, so that a run stopped from outside still says what it waited on.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

GRACE_S = float(os.environ.get("KVMESH_TEST_WATCHDOG_GRACE_S", 120))
"""Seconds past a test's own timeout before its process ends itself: pytest-timeout's signal goes first."""
REPORT_AFTER_S = float(os.environ.get("KVMESH_TEST_WATCHDOG_REPORT_S", 300))
"""Seconds a test runs before the controller names it (then at each doubling)."""
RUN_DIR_ENV = "KVMESH_TEST_RUN_DIR"
"""The directory the run's test processes share (set by the first process; xdist's inherit it)."""
POLL_S = 1.0


def run_dir() -> Path:
    """This run's directory, made by the first process that asks (the controller, before it starts the others)."""
    if not os.environ.get(RUN_DIR_ENV):
        os.environ[RUN_DIR_ENV] = tempfile.mkdtemp(prefix="kvmesh-test-run-")
    return Path(os.environ[RUN_DIR_ENV])


def hung_list() -> Path:
    return run_dir() / "hung"


def hung_before(nodeid: str) -> bool:
    try:
        return nodeid in hung_list().read_text().splitlines()
    except OSError:
        return False


def test_timeout_s(item: pytest.Item) -> float | None:
    """The test's pytest-timeout limit (its mark, else the ini value); None where it has none."""
    marker = item.get_closest_marker("timeout")
    value = marker.args[0] if marker and marker.args else marker.kwargs.get("timeout") if marker else None
    if value is None:
        try:
            value = item.config.getini("timeout")
        except ValueError:  # pytest-timeout not installed
            return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


class Running:
    """The test this process runs now and when it must have ended; a daemon thread ends the process past that."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.nodeid: str | None = None
        self.deadline = float("inf")
        self.limit_s = 0.0
        threading.Thread(target=self.watch, name="kvmesh-test-watchdog", daemon=True).start()

    def start(self, nodeid: str, limit_s: float) -> None:
        with self.lock:
            self.nodeid, self.limit_s, self.deadline = nodeid, limit_s, time.monotonic() + limit_s

    def stop(self) -> None:
        with self.lock:
            self.nodeid, self.deadline = None, float("inf")

    def watch(self) -> None:
        while True:
            time.sleep(POLL_S)
            with self.lock:
                overdue = self.nodeid if time.monotonic() > self.deadline else None
                limit_s = self.limit_s
            if overdue:
                end_hung(self.config, overdue, limit_s)


def end_hung(config: pytest.Config, nodeid: str, limit_s: float) -> None:
    """Names the test, prints what it wrote and every thread's stack, lists it as hung and ends this process.
    pytest holds the test's output (its capture points stdout and stderr at files): given back to the terminal
    first, as pytest-timeout's own thread method does."""
    captured = ("", "")
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
        captured = capman.read_global_capture()
    for name, text in zip(("stdout", "stderr"), captured, strict=True):
        if text:
            sys.stderr.write(f"\n[watchdog] {nodeid}: its captured {name}, last 4000 characters:\n{text[-4000:]}\n")
    sys.stderr.write(f"\n[watchdog] {nodeid} still running after {limit_s:.0f} s (its timeout did not end it): "
                     "every thread's stack follows; this test process ends here\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    try:
        with hung_list().open("a") as out:
            out.write(nodeid + "\n")
    except OSError:
        pass
    os._exit(70)


RUNNING: Running | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global RUNNING
    timeout_s = test_timeout_s(item)
    if timeout_s is None:
        yield
        return
    RUNNING = RUNNING or Running(item.config)
    RUNNING.start(item.nodeid, timeout_s + GRACE_S)
    try:
        yield
    finally:
        RUNNING.stop()


def pytest_runtest_setup(item):
    if hung_before(item.nodeid):
        pytest.fail("this test hung an earlier test process past its timeout (its stacks were printed then, under "
                    "'[watchdog]'): not run again", pytrace=False)


class Reporter:
    """In the process that prints the results: the tests started and not yet finished, named when long."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.started: dict[str, float] = {}
        self.next_report: dict[str, float] = {}
        threading.Thread(target=self.watch, name="kvmesh-test-reporter", daemon=True).start()

    def begin(self, nodeid: str) -> None:
        with self.lock:
            self.started[nodeid] = time.monotonic()
            self.next_report[nodeid] = REPORT_AFTER_S

    def end(self, nodeid: str) -> None:
        with self.lock:
            self.started.pop(nodeid, None)
            self.next_report.pop(nodeid, None)

    def watch(self) -> None:
        while True:
            time.sleep(POLL_S)
            now = time.monotonic()
            with self.lock:
                due = [(nodeid, now - start) for nodeid, start in self.started.items()
                       if now - start >= self.next_report[nodeid]]
                for nodeid, _ in due:
                    self.next_report[nodeid] *= 2
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            for nodeid, seconds in due:
                line = f"[watchdog] still running after {seconds:.0f} s: {nodeid}"
                if terminal is not None:
                    terminal.write_line(line)  # where the dots go
                else:
                    print(line, file=sys.__stderr__, flush=True)


REPORTER: Reporter | None = None


def pytest_configure(config):
    global REPORTER
    run_dir()  # before xdist starts its test processes: they inherit the variable
    if not hasattr(config, "workerinput"):
        REPORTER = Reporter(config)


def pytest_runtest_logstart(nodeid, location):
    if REPORTER is not None:
        REPORTER.begin(nodeid)


def pytest_runtest_logreport(report):
    if REPORTER is not None and report.when not in ("setup", "call"):  # its teardown, or xdist's crash report
        REPORTER.end(report.nodeid)


def pytest_runtest_logfinish(nodeid, location):
    if REPORTER is not None:
        REPORTER.end(nodeid)
