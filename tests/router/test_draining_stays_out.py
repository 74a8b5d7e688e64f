"""A draining replica stays out of rotation until it is removed or registered anew, whatever marks it healthy
later: a health probe that found it out of rotation before the drain and finishes after it (the probe awaits the
compatibility check and its KV peers in between) must not put it back."""

from __future__ import annotations

from kvmesh.router.replicas.replica import DRAINING
from kvmesh.router.routing.kv_router import KVRouter


def test_a_replica_marked_healthy_after_its_drain_stays_out_of_rotation():
    router = KVRouter()
    router.add_replica("a")
    b = router.add_replica("b", healthy=False)  # a probe saw it answer and awaits before marking it healthy
    b.state = DRAINING  # the drain (router/control/runtime.py) lands meanwhile
    router.set_healthy(b, False)
    router.set_healthy(b, True)  # the probe ends
    assert not b.healthy and router.healthy == frozenset({"a"})
    assert router.route([1] * 64).replica.id == "a"


def test_a_replica_not_draining_is_made_healthy():
    router = KVRouter()
    b = router.add_replica("b", healthy=False)
    router.set_healthy(b, True)
    assert b.healthy and router.healthy == frozenset({"b"})
