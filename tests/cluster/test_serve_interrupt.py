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
import threading
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


def _left_behind(run: str) -> list[psutil.Process]:
    """The run's processes still there after a moment (what was killed last may take a moment to be reaped)."""
    deadline = time.monotonic() + 10
    while (left := _processes_of(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _kill_what_is_left(run: str, proc: subprocess.Popen) -> None:
    for leftover in _processes_of(run):
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _describe(left: list[psutil.Process]) -> str:
    return "; ".join(f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in left)


def test_ctrl_c_during_start_up_imports_leaves_no_process(stories_path, tmp_path):
    run, proc = _start_serve(stories_path, tmp_path)
    try:
        time.sleep(1)  # the moment under test: Ctrl-C 1 s in, before serve printed a line
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
        left = _left_behind(run)
        assert not left, "Ctrl-C at start-up's imports left: " + _describe(left) + "\n" + out[-2000:]
        # Python itself prints an interrupt that lands in an os.fork hook ("Exception ignored in"); no other
        assert out.count("Traceback (most recent call last)") <= out.count("Exception ignored in"), out[-3000:]
        assert not list((tmp_path / "clusters").glob("*.json")), "the stopped cluster's admin key record stayed"
    finally:
        _kill_what_is_left(run, proc)


EARLY_CASES = {"ctrl-c-ray": ("ray", 0.0, signal.SIGINT, 60), "ctrl-c-placing": ("placing", 0.0, signal.SIGINT, 60),
               "sigterm-0.5s-into-ray": ("ray", 0.5, signal.SIGTERM, 45),
               "sigterm-4s-into-ray": ("ray", 4.0, signal.SIGTERM, 45)}
"""Signals during start-up, each the moment serve prints its ``STAGES`` line (plus a delay): (stage, delay s,
signal, seconds serve may take to stop). SIGINT goes to serve's process group (a terminal's Ctrl-C), SIGTERM to
serve alone (a supervisor's or a user's ``kill PID``)."""


def _signal_at_stage(proc: subprocess.Popen, case: str) -> tuple[bool, str]:
    """Wait for ``case``'s moment, send its signal, let serve stop: (serve was alive at that moment, its output)."""
    stage, after_s, signum, stop_s = EARLY_CASES[case]
    head = _until_line(proc, STAGES[stage])
    alive = proc.poll() is None
    if alive:
        time.sleep(after_s)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    return alive, head + proc.communicate(timeout=stop_s)[0]


@pytest.fixture(scope="module")
def early_stops(stories_path, tmp_path_factory):
    """Every ``EARLY_CASES`` case on a serve of its own, each watched by a thread that signals it the moment its line
    appears (so each signal still lands in its stage). The case that waits for Ray to be up runs first, alone (Ray
    gives a raylet a fixed 30 s to register: one full Ray start at a time on a loaded machine); the cases that stop
    Ray as it starts then run side by side. {case: (run, process, its tmp dir, (alive, output) or the exception)}."""
    started: dict[str, tuple] = {}
    outcomes: dict[str, object] = {}

    def watch(case: str) -> None:
        try:
            outcomes[case] = _signal_at_stage(started[case][1], case)
        except Exception as e:  # the test of that case reports it
            outcomes[case] = e

    for wave in ([c for c in EARLY_CASES if EARLY_CASES[c][0] == "placing"],
                 [c for c in EARLY_CASES if EARLY_CASES[c][0] != "placing"]):
        threads = []
        for case in wave:
            tmp = tmp_path_factory.mktemp(case)
            started[case] = (*_start_serve(stories_path, tmp), tmp)
            threads.append(threading.Thread(target=watch, args=(case,), daemon=True))
            threads[-1].start()
        for thread in threads:
            thread.join(timeout=240)
    yield {case: (*started[case], outcomes.get(case, "no outcome within 240 s")) for case in EARLY_CASES}
    for run, proc, _ in started.values():
        _kill_what_is_left(run, proc)


def _stopped(early_stops, case: str) -> tuple[str, subprocess.Popen, Path, str]:
    run, proc, tmp, outcome = early_stops[case]
    assert isinstance(outcome, tuple), f"{case}: {outcome!r}"
    alive, out = outcome
    assert alive, f"serve ended before {case}'s moment:\n{out[-3000:]}"
    return run, proc, tmp, out


@pytest.mark.parametrize("case", ["ctrl-c-ray", "ctrl-c-placing"])
def test_ctrl_c_during_start_up_leaves_no_process(case, early_stops):
    run, proc, tmp, out = _stopped(early_stops, case)
    left = _left_behind(run)
    assert not left, f"{case} left: " + _describe(left) + "\n" + out[-2000:]
    # Python itself prints an interrupt that lands in an os.fork hook ("Exception ignored in"); no other
    assert out.count("Traceback (most recent call last)") <= out.count("Exception ignored in"), out[-3000:]
    assert not list((tmp / "clusters").glob("*.json")), "the stopped cluster's admin key record stayed"


@pytest.mark.parametrize("case", ["sigterm-0.5s-into-ray", "sigterm-4s-into-ray"])
def test_sigterm_to_serve_alone_during_start_up_stops_it_cleanly(case, early_stops):
    """``kill PID`` (SIGTERM to serve alone: what a supervisor or a user's ``kill`` sends) 0.5 s or 4 s after Ray
    began to start -- Ray starting, or the replica loading -- stops serve as Ctrl-C does: its shutdown message, exit
    143, within the time bound, nothing left behind (Ray's own SIGTERM handler does not take over)."""
    run, proc, _, out = _stopped(early_stops, case)
    left = _left_behind(run)
    assert not left, f"{case} left: " + _describe(left) + "\n" + out[-2000:]
    assert proc.returncode == 143 and "shutting down..." in out and out.rstrip().endswith("kvmesh: stopped"), \
        (proc.returncode, out[-3000:])


READY_CASES = {"sigterm-group": (signal.SIGTERM, 143, "group"), "sigint-group": (signal.SIGINT, 130, "group"),
               "sigterm-every-process": (signal.SIGTERM, 143, "every process")}
"""The signals sent to a ready serve: (signal, exit code, to whom)."""


@pytest.fixture(scope="module")
def ready_serves(stories_path, tmp_path_factory):
    """One ``kvmesh serve`` per ``READY_CASES`` case, each its own Ray and marker, started one after another's Ray is
    up (Ray gives a raylet a fixed 30 s to register: one Ray start at a time on a loaded machine), so their replicas
    load side by side. {case: (run, process, its output so far)}; each case's test signals its own, and what a failed
    test left is killed here."""
    serves = {}
    for case in READY_CASES:
        run, proc = _start_serve(stories_path, tmp_path_factory.mktemp(case))
        serves[case] = (run, proc, _until_line(proc, STAGES["placing"]))
    yield serves
    for run, proc, _ in serves.values():
        _kill_what_is_left(run, proc)


@pytest.mark.parametrize("case", READY_CASES)
def test_a_signal_to_the_process_group_of_a_ready_serve_stops_it_cleanly(case, ready_serves):
    """What `timeout` and a terminal's Ctrl-C do: every process of serve's group gets the signal; and what
    systemd does by default (KillMode=control-group): every process serve started, Ray's too. serve says it
    stopped, exits as a process stopped by that signal, and leaves nothing (Ray's processes, in their own
    session, are stopped by serve; when they got the signal as well, serve no longer waits for their GCS)."""
    signum, code, whom = READY_CASES[case]
    run, proc, head = ready_serves[case]
    head += _until_line(proc, "kvmesh is ready")
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
    left = _left_behind(run)
    assert not left, _describe(left)
