"""A dispatched request's load accounting (router/http/in_flight.py): every way out of an attempt either finishes
it or hands it to the answer, so a replica's in-flight count and pending prefill come back to zero."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.http.in_flight import InFlight, reserved
from kvmesh.router.http.proxy import Forwarder
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.relay import Opened
from kvmesh.router.replicas.replica import READY, Replica
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.load import LoadTracker

PROMPT = list(range(64))


def _tracker() -> LoadTracker:
    loads = LoadTracker()
    loads.replicas.add(Replica("a", healthy=True, state=READY))
    return loads


def _flight(loads: LoadTracker, choices_out=None, holds_out=None, predict_hold_s: float = 0.0) -> InFlight:
    """An attempt on replica a of the router owning ``loads`` (``choices_out``, ``holds_out``: its sync stream's
    hooks)."""
    decision = SimpleNamespace(replica=loads.replicas.get("a"), uncached_tokens=48, pull=None, sequences=1,
                               keys=[11, 12, 13])
    router = SimpleNamespace(loads=loads, forget_pull=lambda d: None, choices_out=choices_out, holds_out=holds_out,
                             predict_hold_s=predict_hold_s, released=[])
    router.release_prediction = router.released.append  # a held prediction: released at the answer or the end
    return InFlight(router, decision, len(PROMPT))


def _counts(loads: LoadTracker, rid: str = "a") -> tuple[int, int]:
    load = loads.loads[rid]
    return load.in_flight, load.pending_prefill_tokens


def test_an_attempt_left_without_an_answer_is_finished():
    loads = _tracker()
    with _flight(loads) as flight:
        assert _counts(loads) == (1, 48)
        assert flight.router.released == []
    assert _counts(loads) == (0, 0)
    assert flight.router.released == [flight.decision]


def test_a_router_that_syncs_tells_the_others_of_the_attempt_with_its_booking_and_keys():
    loads = _tracker()
    loads.apply_published(loads.replicas.get("a"), LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0))  # it books there
    told: list[tuple] = []
    with _flight(loads, lambda replica, *choice: told.append((replica.id, *choice))):
        pass
    with _flight(loads, lambda replica, *choice: told.append((replica.id, *choice))):
        pass
    assert told == [("a", 1, 48, [11, 12, 13], False), ("a", 2, 48, [11, 12, 13], False)]


@pytest.mark.parametrize("answered", [False, True])
def test_a_held_prediction_is_released_on_the_other_routers_once_at_the_answer_or_the_end(answered):
    told: list[tuple] = []
    released: list[tuple] = []

    def publish(replica, *choice):
        told.append(choice)
        return 7  # the hold's number on the stream

    with _flight(_tracker(), publish, lambda replica, hold: released.append((replica.id, hold)), 30.0) as flight:
        assert told[0][-1] is True and released == []  # told as held
        if answered:
            flight.answered()
            assert released == [("a", 7)]
    assert released == [("a", 7)]  # answered or not, once


def test_an_answered_attempt_is_handed_to_its_answer():
    loads = _tracker()
    with _flight(loads) as flight:
        flight.answered()
        assert flight.router.released == [flight.decision]  # its prompt is computed
    assert _counts(loads) == (1, 0)  # the answer's finish (had_output=True) ends it
    assert flight.router.released == [flight.decision]
    loads.on_finish(loads.replicas.get("a"), 48, had_output=True)
    assert _counts(loads) == (0, 0)


@pytest.mark.parametrize("answered", [False, True])
def test_an_exception_finishes_the_attempt_answered_or_not(answered):
    loads = _tracker()
    with pytest.raises(RuntimeError), _flight(loads) as flight:
        if answered:
            flight.answered()
        raise RuntimeError("after dispatch, before the answer took it")
    assert _counts(loads) == (0, 0)  # pending prefill is not taken off twice either


def test_a_cancelled_attempt_is_finished():
    loads = _tracker()

    async def attempt() -> None:
        with _flight(loads):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(attempt())
        await asyncio.sleep(0)
        assert _counts(loads) == (1, 48)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _counts(loads) == (0, 0)


def test_a_reservation_is_released_however_its_block_ends():
    loads = _tracker()
    with pytest.raises(RuntimeError), reserved(loads, loads.replicas.get("a")):
        assert _counts(loads) == (1, 0)
        raise RuntimeError("the prefill call failed")
    assert _counts(loads) == (0, 0)


# ---------------------------------------------------------------- through Forwarder.dispatch
class _Upstream:
    def __init__(self, status: int) -> None:
        self.status, self.closed, self.headers = status, False, {}

    def close(self) -> None:
        self.closed = True


def _forwarder(open_on) -> tuple[Forwarder, KVRouter]:
    """A Forwarder over replicas a and b whose ``_open`` is ``open_on(replica id)``."""
    router = KVRouter(block_size=16)
    for rid in ("a", "b"):
        router.add_replica(rid, spec=SimpleNamespace(url=f"http://{rid}"))
    plane = SimpleNamespace(
        router=router, config=SimpleNamespace(upstream=SimpleNamespace(max_attempts=3)), headers={},
        metrics=MagicMock(), receipt_metrics=MagicMock(), failures=MagicMock())
    forwarder = Forwarder(plane)

    async def fake_open(replica, request, headers, decision):
        opened = open_on(replica.id, decision)
        return opened._replace(replica=replica) if isinstance(opened, Opened) else opened

    forwarder._open = fake_open
    return forwarder, router


def _dispatch(forwarder: Forwarder) -> tuple[Opened, list[str]]:
    tried: list[str] = []
    request = ProxyRequest.continuation({"prompt": PROMPT}, PROMPT, None)
    return asyncio.run(forwarder.dispatch(request, tried)), tried


def _all_counts(router: KVRouter) -> dict[str, tuple[int, int]]:
    return {rid: _counts(router.loads, rid) for rid in ("a", "b")}


@pytest.mark.parametrize("hostile", [asyncio.CancelledError, RuntimeError])
def test_dispatch_finishes_an_attempt_its_open_raised_out_of(hostile):
    def open_on(rid, decision):
        raise hostile()

    forwarder, router = _forwarder(open_on)
    with pytest.raises(hostile):
        _dispatch(forwarder)
    assert _all_counts(router) == {"a": (0, 0), "b": (0, 0)}


def test_dispatch_finishes_a_failed_replica_and_hands_the_retry_to_its_answer():
    chosen: list[str] = []

    def open_on(rid, decision):  # the first replica answers 503, the next one 200
        chosen.append(rid)
        return Opened(_Upstream(503 if len(chosen) == 1 else 200), b"{", None, decision, None)

    forwarder, router = _forwarder(open_on)
    opened, tried = _dispatch(forwarder)
    assert tried == chosen[:1] and opened.decision.replica_id == chosen[1]
    counts = _all_counts(router)
    assert counts[chosen[0]] == (0, 0)  # finished when it failed
    assert counts[chosen[1]] == (1, 0)  # answered: its answer finishes it


def test_dispatch_hands_the_last_error_to_its_answer_when_every_replica_failed():
    forwarder, router = _forwarder(lambda rid, decision: Opened(_Upstream(503), b"{}", None, decision, None))
    forwarder.plane.config.upstream.max_attempts = 2
    opened, tried = _dispatch(forwarder)
    assert opened.upstream.status == 503 and len(tried) == 1
    assert _all_counts(router)[opened.decision.replica_id] == (1, 0)
    assert _all_counts(router)[tried[0]] == (0, 0)


def test_dispatch_answers_503_when_no_replica_is_left():
    forwarder, router = _forwarder(lambda rid, decision: ConnectionResetError("reset"))
    with pytest.raises(ProtocolError) as e:
        _dispatch(forwarder)
    assert e.value.status_code == 503
    assert _all_counts(router) == {"a": (0, 0), "b": (0, 0)}


# ---------------------------------------------------------------- a pull that will not land
def _pulling_forwarder(open_on) -> tuple[Forwarder, KVRouter, object]:
    """A Forwarder over test_pull_landing's router (a holds the context, busy: the context goes elsewhere and pulls);
    its first decision, with a pull counted as landing on its replica."""
    from .test_pull_landing import CONTEXT, _router

    router = _router()
    for replica in router.replicas:
        replica.spec = SimpleNamespace(url=f"http://{replica.id}")
    decision = router.route(CONTEXT)
    assert decision.pull is not None and decision.replica.load.landing_pulls == 1
    forwarder, _ = _forwarder(open_on)
    forwarder.plane.router = router
    return forwarder, router, decision


@pytest.mark.parametrize("how", ["cancelled", "failed over"])
def test_a_pull_whose_attempt_ends_unanswered_no_longer_counts_on_its_replica(how):
    """A client that cancels before its replica answers (or a replica that fails first) leaves no pull landing there:
    the replica is not priced as busier for the pull's seconds."""
    def open_on(rid, decision):
        if how == "cancelled":
            raise asyncio.CancelledError()
        return Opened(_Upstream(503 if decision is first else 200), b"{", None, decision, None)

    forwarder, router, first = _pulling_forwarder(open_on)
    request = ProxyRequest.continuation({"prompt": list(range(16))}, list(range(16)), None)
    if how == "cancelled":
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(forwarder.dispatch(request, [], first))
    else:
        asyncio.run(forwarder.dispatch(request, [], first))
    router.landing.count(None)
    assert first.replica.load.landing_pulls == 0


def test_an_answered_pull_still_counts_until_its_priced_seconds_pass():
    """The simulator's rule: a pull that was answered counts for its priced seconds (a stream's first bytes may come
    before its pull lands)."""
    forwarder, router, first = _pulling_forwarder(lambda rid, decision: Opened(_Upstream(200), b"{", None, decision,
                                                                               None))
    request = ProxyRequest.continuation({"prompt": list(range(16))}, list(range(16)), None)
    asyncio.run(forwarder.dispatch(request, [], first))
    assert first.replica.load.landing_pulls == 1
