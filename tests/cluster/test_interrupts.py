"""`kvmesh serve`'s Ctrl-C is never lost: one swallowed on the way (an exception inside an os.fork hook is
only printed) is delivered again until the main thread acts on it."""

from __future__ import annotations

import os
import signal
import time

import pytest
from kvmesh.cluster.interrupts import Interrupts, Terminated


@pytest.fixture
def interrupts():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    handler = Interrupts(redeliver_s=0.2)
    handler.install()
    yield handler
    handler.ignore()
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_a_swallowed_ctrl_c_is_raised_again(interrupts):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)  # a deadline only: the handler's KeyboardInterrupt ends it at once
    except KeyboardInterrupt:
        pass  # swallowed, as logging's fork hook swallows it
    assert interrupts.pending
    with pytest.raises(KeyboardInterrupt):
        time.sleep(5)  # a deadline only: the redelivery (every 0.2 s) interrupts it


def test_sigterm_is_an_exception_and_ignore_ends_redelivery(interrupts):
    with pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # a deadline only: Terminated ends it at once
    interrupts.ignore()
    time.sleep(0.5)  # what must not happen: nothing is delivered after ignore() (asserting an absence)
    os.kill(os.getpid(), signal.SIGINT)  # ignored now: the shutdown itself is not interrupted
    time.sleep(0.1)  # what must not happen (an absence): no KeyboardInterrupt while it could land


def test_sigterm_while_ray_starts_is_held_until_ray_init_returns(interrupts):
    """Raised half-way through ``ray.init`` it left Ray's native core half set up, which aborted the process when
    serve then shut Ray down; held, serve stops right after Ray is up (exit 143, as before)."""
    from kvmesh.cluster.interrupts import kept_from_ray

    ray_init_returned = False
    with pytest.raises(Terminated), kept_from_ray():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)  # a handler that raised would have ended the block here
        ray_init_returned = True
    assert ray_init_returned and interrupts.exit_code == 143


def test_a_second_sigterm_or_a_ctrl_c_while_ray_starts_is_not_held(interrupts):
    from kvmesh.cluster.interrupts import kept_from_ray

    second_held = False
    with pytest.raises(Terminated), kept_from_ray():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor insists
        time.sleep(2)  # a deadline only
        second_held = True
    assert not second_held
    ctrl_c_held = False
    with pytest.raises(KeyboardInterrupt), kept_from_ray():
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaches Ray's processes too: ray.init fails at once anyway
        time.sleep(2)
        ctrl_c_held = True
    assert not ctrl_c_held
