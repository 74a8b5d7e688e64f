"""Routers that sync their choices (router/control/router_sync.py) count each other's bookings on a replica until the
replica's published load acknowledges them (``LoadTracker.peer_booked``, router/replicas/bookings.py PeerBookings):
inside a burst each sees the others' requests before any replica has said a word."""

from __future__ import annotations

from kvmesh.router.routing.load import BOOKING_MAX_AGE_S, MAX_PEER_ROUTERS

from tests.router.test_published_load import _Replica, _routers


def _published(*trackers, replica: _Replica | None = None, now: float = 0.0) -> _Replica:
    replica = replica or _Replica()
    update = replica.publish(now)
    for tracker in trackers:
        tracker.apply_published(tracker.replicas.get("r0"), update, now=now)
    return replica


def test_a_peers_booking_counts_until_the_replica_acknowledges_it_and_never_twice():
    a, b = _routers(2, "r0")
    replica = _published(a, b)
    number = a.on_dispatch(a.replicas.get("r0"), 300, now=0.1)
    assert b.peer_booked(b.replicas.get("r0"), a.router_id, number, 300, now=0.1)
    assert b.loads["r0"].prefill_backlog == a.loads["r0"].prefill_backlog == 300  # one view inside the burst
    assert not b.peer_booked(b.replicas.get("r0"), a.router_id, number, 300, now=0.1)  # a repeat counts nothing
    replica.accept(a, number, 300, 0.11)
    _published(a, b, replica=replica, now=0.12)
    # the replica counts it now: 300 queued there, nothing unacknowledged on either router
    assert (b.loads["r0"].prefill_backlog, b.loads["r0"].unacked_requests) == (300, 0)
    assert a.loads["r0"].prefill_backlog == 300


def test_an_acknowledgement_that_comes_before_the_booking_leaves_nothing_to_count():
    a, b = _routers(2, "r0")
    replica = _published(a, b)
    number = a.on_dispatch(a.replicas.get("r0"), 300, now=0.1)
    replica.accept(a, number, 300, 0.11)
    _published(b, replica=replica, now=0.12)  # b reads the replica's word first, then a's choice arrives
    assert not b.peer_booked(b.replicas.get("r0"), a.router_id, number, 300, now=0.13)
    assert b.loads["r0"].prefill_backlog == 300


def test_a_lost_peer_booking_ages_out_and_its_router_is_forgotten():
    a, b = _routers(2, "r0")
    _published(a, b)
    b.peer_booked(b.replicas.get("r0"), a.router_id, 1, 500, now=0.1)
    _published(b, now=0.5)  # a fresh update that does not acknowledge it (the request failed on the way)
    b.age_published(now=0.1 + BOOKING_MAX_AGE_S + 0.01)
    load = b.loads["r0"]
    assert (load.unacked_requests, load.unacked_prefill_tokens, load.peer_bookings) == (0, 0, {})


def test_a_feed_cannot_book_for_this_router_for_a_replica_without_published_load_or_for_endless_ids():
    (b,) = _routers(1, "r0")
    replica = b.replicas.get("r0")
    assert not b.peer_booked(replica, "other", 1, 100, now=0.0)  # no published load yet: /load polls count it
    _published(b)
    assert not b.peer_booked(replica, b.router_id, 99, 100, now=0.0)  # its own id: its own bookings are exact
    for k in range(MAX_PEER_ROUTERS + 10):
        b.peer_booked(replica, f"liar-{k}", 1, 100, now=0.0)
    assert len(replica.load.peer_bookings) == MAX_PEER_ROUTERS
    assert replica.load.unacked_prefill_tokens == 100 * MAX_PEER_ROUTERS


def test_a_replica_whose_stream_stops_forgets_the_peers_bookings_with_its_own():
    a, b = _routers(2, "r0")
    _published(b)
    b.peer_booked(b.replicas.get("r0"), a.router_id, 1, 500, now=0.1)
    b.stop_published(b.replicas.get("r0"))
    assert (b.loads["r0"].unacked_requests, b.loads["r0"].peer_bookings) == (0, {})
