"""A read is over only when the transport says so: nixl's refusal to release a handle in flight is kept (the
handle retried later, never dropped), a holder's tiers are in flight while any is, and under tensor parallelism
while any rank's read is unanswered."""

from __future__ import annotations

import threading

import pytest
from kvmesh.replica.kv_transfer.nixl_agent import NixlTransfer
from kvmesh.replica.kv_transfer.pull_read import TierReads
from kvmesh.replica.kv_transfer.tp_agent import TPTransfer


class FakeNixl:
    """nixl_agent's transfer calls: a read in flight until ``done``; releasing it meanwhile is refused (nixl cannot
    cancel a UCX read already posted) unless ``cancellable``."""

    def __init__(self, cancellable: bool = False) -> None:
        self.done, self.cancellable, self.released = False, cancellable, []

    def check_xfer_state(self, handle) -> str:
        return "DONE" if self.done else "PROC"

    def release_xfer_handle(self, handle) -> None:
        if not self.done and not self.cancellable:
            raise RuntimeError("NIXL_ERR_REPOST_ACTIVE")
        self.released.append(handle)


def _transfer(nixl: FakeNixl) -> NixlTransfer:
    return NixlTransfer(nixl, threading.RLock(), "handle-1", 4)


def test_a_nixl_read_whose_release_is_refused_stays_in_flight_and_is_released_later():
    nixl = FakeNixl()
    transfer = _transfer(nixl)
    transfer.abort()  # refused: the read keeps running
    assert transfer.state() == "PROC" and transfer.release() is False and nixl.released == []
    nixl.done = True
    assert transfer.state() == "DONE" and transfer.release() is True and nixl.released == ["handle-1"]
    assert transfer.release() is True and nixl.released == ["handle-1"]  # once


def test_a_nixl_read_that_nixl_cancels_is_over_at_once_as_err():
    nixl = FakeNixl(cancellable=True)
    transfer = _transfer(nixl)
    transfer.abort()
    assert nixl.released == ["handle-1"] and transfer.state() == "ERR" and transfer.release() is True


def test_a_post_that_failed_is_err_and_still_released():
    nixl = FakeNixl()
    nixl.done = True
    transfer = NixlTransfer(nixl, threading.RLock(), "handle-2", 4, posted="ERR")
    assert transfer.state() == "ERR" and transfer.release() is True and nixl.released == ["handle-2"]


class Fixed:
    def __init__(self, state: str, releasable: bool = True) -> None:
        self._state, self.releasable, self.aborted = state, releasable, False

    def state(self) -> str:
        return self._state

    def abort(self) -> None:
        self.aborted = True

    def release(self) -> bool:
        return self.releasable


def test_one_tiers_error_beside_a_live_read_is_a_failure_but_not_over():
    host, device = Fixed("ERR"), Fixed("PROC", releasable=False)
    reads = TierReads([device, host], 6)
    assert reads.failed() and reads.state() == "PROC" and reads.release() is False
    device._state, device.releasable = "DONE", True
    assert reads.state() == "ERR" and reads.release() is True


class FakeRank:
    def __init__(self) -> None:
        self.aborts: list[str] = []
        outer = self

        class Remote:
            @staticmethod
            def remote(read_id):
                outer.aborts.append(read_id)

        self.kv_abort = Remote()


def test_a_tp_read_is_in_flight_while_a_rank_is_unanswered_even_when_another_failed(monkeypatch):
    ray = pytest.importorskip("ray")
    answered: dict[str, BaseException | None] = {"rank0": RuntimeError("rank 0's read failed")}

    def wait(refs, num_returns, timeout):
        ready = [r for r in refs if r in answered]
        return ready, [r for r in refs if r not in answered]

    def get(ref, timeout=None):
        if answered[ref] is not None:
            raise answered[ref]

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", get)
    ranks = [FakeRank(), FakeRank()]
    transfer = TPTransfer(ranks, "read-7", ["rank0", "rank1"], 4)
    assert transfer.failed() and transfer.state() == "PROC" and transfer.release() is False
    transfer.abort()
    assert [r.aborts for r in ranks] == [["read-7"], ["read-7"]]
    answered["rank1"] = None  # rank 1's read is over too
    assert transfer.state() == "ERR" and transfer.release() is True
