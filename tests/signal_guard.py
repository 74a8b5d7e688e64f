"""Ctrl-C and SIGTERM in the test process: Python's handlers put back after each test, and the kernel's view
checked around each test file.

A process started while SIGINT is ignored keeps it ignored across ``exec`` (Python then installs no
KeyboardInterrupt), so a test process that ignores it hands that to every command a later test starts, and a
Ctrl-C the test sends stops nothing. ``signal.getsignal`` cannot see every way it happens: a native library may
set the disposition without telling Python's table. This guard reads the kernel's own view (``/proc/self/status``)
before and after each test file, module fixtures included, and fails the file that changed it, naming the signal;
it puts the disposition back so that later files run as they would alone. Linux only (elsewhere it does nothing).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

WATCHED = (signal.SIGINT, signal.SIGTERM)
STATUS = Path("/proc/self/status")


def held() -> dict[str, set[signal.Signals]]:
    """The watched signals the process ignores (``SigIgn``) and the main thread blocks (``SigBlk``); empty sets
    where /proc is not there."""
    try:
        fields = dict(line.split(":", 1) for line in STATUS.read_text().splitlines() if ":" in line)
    except OSError:
        return {"ignored": set(), "blocked": set()}
    masks = {name: int(fields.get(key, "0").strip(), 16) for name, key in (("ignored", "SigIgn"),
                                                                           ("blocked", "SigBlk"))}
    return {name: {sig for sig in WATCHED if mask >> (sig - 1) & 1} for name, mask in masks.items()}


def put_back(before: dict[str, set[signal.Signals]], after: dict[str, set[signal.Signals]]) -> None:
    """Undo what ``after`` holds beyond ``before``: a newly ignored signal gets Python's own default handler
    (``default_int_handler`` for SIGINT), a newly blocked one is unblocked."""
    for sig in after["ignored"] - before["ignored"]:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if newly_blocked := after["blocked"] - before["blocked"]:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, newly_blocked)


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """Each test leaves Ctrl-C and SIGTERM as it found them. A test that runs a command's main in this process (whose
    shutdown ignores a second Ctrl-C) would otherwise leave them ignored, and every process a later test starts
    would inherit that: Python then installs no KeyboardInterrupt, and a Ctrl-C the test sends stops nothing."""
    before = {sig: signal.getsignal(sig) for sig in WATCHED}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(scope="module", autouse=True)
def signal_dispositions_kept(request):
    """Fails the test file after which SIGINT or SIGTERM is ignored or blocked where it was not before it."""
    before = held()
    yield
    after = held()
    changed = [f"{name} {sig.name}" for name in ("ignored", "blocked") for sig in sorted(after[name] - before[name])]
    if changed:
        put_back(before, after)
        pytest.fail(f"{request.node.nodeid} left the test process with {', '.join(changed)} (a module fixture, an "
                    "import or a native library; every process a later test starts would inherit it)", pytrace=False)


def started_ignoring() -> set[signal.Signals]:
    """At start-up: the watched signals this process was started with ignored (inherited from what started
    pytest: a shell's background job, a CI runner), given their default action back, as a terminal's session has
    them; the ones it found ignored."""
    ignored = held()["ignored"]
    put_back({"ignored": set(), "blocked": set()}, {"ignored": ignored, "blocked": set()})
    return ignored
