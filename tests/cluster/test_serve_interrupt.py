"""Ctrl-C at any point of `kvmesh serve`'s start-up leaves no process of that run behind.

Each run is marked by a variable in its environment, which every process it starts inherits (Ray's
GCS, raylet, agents and workers included), so the check finds exactly that run's processes, wherever
they were re-parented, and none of the other tests' or users' on the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

KVMESH = Path(sys.executable).parent / "kvmesh"
MARKER = "KVMESH_TEST_SERVE_RUN"


def _processes_of(run: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == run and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone meanwhile, or another user's
            continue
    return found


def _ctrl_c_as_in_a_shell() -> None:
    """Ctrl-C and SIGTERM take their default action in serve, as from a user's shell, even where this test process
    holds them ignored: else a Ctrl-C before serve installs its handlers is lost (inherited, ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _start_serve(stories_path: Path, tmp_path: Path) -> tuple[str, subprocess.Popen]:
    """(run, process): ``kvmesh serve`` of one stories260K replica on free ports, its processes marked ``run``
    (``_processes_of``), in a session of its own so that a signal reaches its whole process group, as a
    terminal's Ctrl-C does."""
    run = uuid.uuid4().hex
    env = {**os.environ, MARKER: run, "KVMESH_CLUSTERS_DIR": str(tmp_path / "clusters"), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    argv = [str(KVMESH), "serve", "--model", str(stories_path), "--num-replicas", "1", "--port", "0",
            "--http-port", "0", "--event-port", "0"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_ctrl_c_as_in_a_shell)
    return run, proc


STAGES = {"imports": None, "ray": "starting a local Ray instance", "placing": "placing 1 replica(s)"}
"""Moments of start-up a Ctrl-C lands in: before serve prints anything (its imports, 1 s in), as Ray starts, as
the replica is placed and loads (each the moment serve reports it, on a fast machine or a loaded one)."""


def _until_line(proc: subprocess.Popen, text: str) -> str:
    """serve's output up to and including the first line with ``text`` (all of it, if serve ended before)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            break
    return "".join(lines)


@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_during_start_up_leaves_no_process(stage, stories_path, tmp_path):
    run, proc = _start_serve(stories_path, tmp_path)
    try:
        head = ""
        if STAGES[stage] is None:
            time.sleep(1)  # the moment under test: Ctrl-C 1 s in, before serve printed a line
        else:
            head = _until_line(proc, STAGES[stage])
            assert proc.poll() is None, head[-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        out = head + proc.communicate(timeout=60)[0]
        deadline = time.monotonic() + 10  # what was killed last may take a moment to be reaped
        while (left := _processes_of(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, (f"Ctrl-C at start-up's {stage} left: "
                          + "; ".join(f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left) + "\n" + out[-2000:])
        # Python itself prints an interrupt that lands in an os.fork hook ("Exception ignored in"); no other
        assert out.count("Traceback (most recent call last)") <= out.count("Exception ignored in"), out[-3000:]
        assert not list((tmp_path / "clusters").glob("*.json")), "the stopped cluster's admin key record stayed"
    finally:
        for leftover in _processes_of(run):
            leftover.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("after_s", [0.5, 4])
def test_sigterm_to_serve_alone_during_start_up_stops_it_cleanly(after_s, stories_path, tmp_path):
    """``kill PID`` (SIGTERM to serve alone: what a supervisor or a user's ``kill`` sends) ``after_s`` after Ray
    began to start -- Ray starting, or the replica loading -- stops serve as Ctrl-C does: its shutdown message, exit
    143, within the time bound, nothing left behind (Ray's own SIGTERM handler does not take over)."""
    run, proc = _start_serve(stories_path, tmp_path)
    try:
        head = _until_line(proc, STAGES["ray"])  # until Ray begins to start (or serve ends)
        time.sleep(after_s)
        proc.send_signal(signal.SIGTERM)
        out = head + proc.communicate(timeout=45)[0]
        deadline = time.monotonic() + 10  # what was killed last may take a moment to be reaped
        while (left := _processes_of(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, (f"SIGTERM {after_s}s into Ray's start left: "
                          + "; ".join(f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left) + "\n" + out[-2000:])
        assert proc.returncode == 143 and "shutting down..." in out and out.rstrip().endswith("kvmesh: stopped"), \
            (proc.returncode, out[-3000:])
    finally:
        for leftover in _processes_of(run):
            leftover.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


READY_CASES = {"sigterm-group": (signal.SIGTERM, 143, "group"), "sigint-group": (signal.SIGINT, 130, "group"),
               "sigterm-every-process": (signal.SIGTERM, 143, "every process")}
"""The signals sent to a ready serve: (signal, exit code, to whom)."""


@pytest.fixture(scope="module")
def ready_serves(stories_path, tmp_path_factory):
    """One ``kvmesh serve`` per ``READY_CASES`` case, all started at once (each its own Ray and marker): a start is
    mostly waiting (Ray's processes, the replica's imports), so three side by side take about the wall time of one.
    Each case's test signals its own; what a failed test left is killed here."""
    serves = {case: _start_serve(stories_path, tmp_path_factory.mktemp(case.replace(" ", "-")))
              for case in READY_CASES}
    yield serves
    for run, proc in serves.values():
        for leftover in _processes_of(run):
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("case", READY_CASES)
def test_a_signal_to_the_process_group_of_a_ready_serve_stops_it_cleanly(case, ready_serves):
    """What `timeout` and a terminal's Ctrl-C do: every process of serve's group gets the signal; and what
    systemd does by default (KillMode=control-group): every process serve started, Ray's too. serve says it
    stopped, exits as a process stopped by that signal, and leaves nothing (Ray's processes, in their own
    session, are stopped by serve; when they got the signal as well, serve no longer waits for their GCS)."""
    signum, code, whom = READY_CASES[case]
    run, proc = ready_serves[case]
    head = _until_line(proc, "kvmesh is ready")
    assert proc.poll() is None, head[-3000:]
    if whom == "group":
        os.killpg(proc.pid, signum)
    else:
        for each in _processes_of(run):
            with contextlib.suppress(psutil.Error):
                each.send_signal(signum)
    out = head + proc.communicate(timeout=60)[0]  # before: Ray ended serve after 60 s
    assert "Failed to connect to GCS" not in out, out[-3000:]
    assert out.rstrip().endswith("kvmesh: stopped") and proc.returncode == code, (proc.returncode, out[-3000:])
    deadline = time.monotonic() + 10  # what was killed last may take a moment to be reaped
    while (left := _processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "; ".join(f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left)
