"""The sync stream between routers (router/control/router_sync.py, router/control/sync_wire.py) over real ZeroMQ
sockets: a router's choice counts on the other router's load and index at once, and what a hostile peer sends is
refused, bounded and counted while the router's loop keeps its pace."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
import zmq
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.router.config import RouterConfig, SyncConfig, build_router
from kvmesh.router.control.router_sync import RouterSync
from kvmesh.router.control.sync_wire import (
    MAX_CHOICES_PER_FRAME,
    TOPIC,
    RouterChoice,
    RouterChoices,
    check,
    decode_choices,
    encode_choices,
    key_check,
    key_seed,
)
from kvmesh.router.http.metrics import _sync_family

INTERNAL_KEY = "internal-key-of-the-test-cluster"
MAX_KEYS = 64


def _router(seed: int):
    router = build_router(RouterConfig(), seed=seed)
    for rid in ("r0", "r1"):
        router.add_replica(rid)
        update = LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0)  # it publishes its load: bookings are counted
        router.loads.apply_published(router.replicas.get(rid), update)
    return router


def _keys(router, n: int = 8) -> list[int]:
    return router.hasher.keys(list(range(16 * n)))


async def _until(condition, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "not within the timeout"
        await asyncio.sleep(0.01)


def test_a_message_round_trips_and_intake_refuses_what_no_router_sends():
    message = RouterChoices("router-a", 1, 7, [RouterChoice("r0", 3, 300, [1, 2, 3])])
    assert decode_choices(encode_choices(message)) == message
    check(message, MAX_KEYS)
    bad = [RouterChoices("", 1, 7, []),
           RouterChoices("a", 1, 7, [RouterChoice("r0", 1, 1, [])] * (MAX_CHOICES_PER_FRAME + 1)),
           RouterChoices("a", 1, 7, [RouterChoice("", 1, 1, [])]),
           RouterChoices("a", 1, 7, [RouterChoice("r0", -1, 1, [])]),
           RouterChoices("a", 1, 7, [RouterChoice("r0", 1, -5, [])]),
           RouterChoices("a", 1, 7, [RouterChoice("r0", 1, 1 << 40, [])]),
           RouterChoices("a", 1, 7, [RouterChoice("r0", 1, 1, list(range(MAX_KEYS + 1)))]),
           RouterChoices("a", 1, 7, [RouterChoice("r0", 1, 1, [-1])])]
    for message in bad:
        with pytest.raises(ValueError):
            check(message, MAX_KEYS)
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_choices(b"\x93\xa1a\x01\xa3not a list")


def test_the_key_seed_comes_from_the_internal_key_and_its_check_tells_seeds_apart():
    assert key_seed(INTERNAL_KEY) == key_seed(INTERNAL_KEY) != key_seed(INTERNAL_KEY + "x")
    assert key_check(key_seed(INTERNAL_KEY)) != key_check(key_seed(INTERNAL_KEY + "x"))


def test_a_sync_config_needs_the_internal_key_and_zeromq_endpoints():
    with pytest.raises(ValueError, match="internal_key"):
        RouterConfig(sync=SyncConfig(bind="tcp://127.0.0.1:0"))
    with pytest.raises(ValueError, match="ZeroMQ"):
        SyncConfig(peers=("http://127.0.0.1:8000",))
    RouterConfig(internal_key=INTERNAL_KEY, sync=SyncConfig(bind="tcp://127.0.0.1:0"))


async def _pair(seed_b: int | None = None):
    seed = key_seed(INTERNAL_KEY)
    a, b = _router(seed), _router(seed if seed_b is None else seed_b)
    loop = asyncio.get_running_loop()
    sync_a = RouterSync(a, SyncConfig(bind="tcp://127.0.0.1:0"), SubscriberConfig(), MAX_KEYS, loop).start()
    sync_b = RouterSync(b, SyncConfig(peers=(sync_a.endpoint,)), SubscriberConfig(), MAX_KEYS, loop).start()
    return a, b, sync_a, sync_b


async def _told(a, b, replica_id: str, keys: list[int], tokens: int) -> None:
    """``a`` sends a request (as InFlight does); wait until ``b`` counts it (a SUB joins a moment after it connects:
    the first sends may go nowhere, so the choice is sent again with a new booking until one arrives)."""
    end = time.monotonic() + 5.0
    while b.loads.loads[replica_id].unacked_requests == 0:
        assert time.monotonic() < end, "the other router never counted the choice"
        number = a.loads.on_dispatch(a.replicas.get(replica_id), tokens)
        a.choices_out(a.replicas.get(replica_id), number, tokens, keys)
        await asyncio.sleep(0.05)


async def test_a_choice_counts_on_the_other_routers_load_and_index_at_once():
    a, b, sync_a, sync_b = await _pair()
    try:
        keys = _keys(a)
        assert b.index.match(keys).get("r1", 0) == 0
        await _told(a, b, "r1", keys, 300)
        load = b.loads.loads["r1"]
        assert load.prefill_backlog == load.unacked_prefill_tokens == 300 * load.unacked_requests
        assert b.index.match(keys)["r1"] == len(keys)  # the blocks it will hold, before any event says so
        assert b.loads.loads["r0"].unacked_requests == 0 and b.index.match(keys).get("r0", 0) == 0
        assert sync_b.counters()["applied"] >= 1 and sync_a.counters()["published"] >= 1
        samples = {(m.labels["peer"], m.labels["counter"]): m.value for m in _sync_family(sync_b.counters()).samples}
        assert samples[("", "applied")] >= 1 and samples[(sync_a.endpoint, "choices")] >= 1  # on /metrics
    finally:
        sync_b.close()
        sync_a.close()


async def test_with_the_events_curve_keys_the_stream_is_the_keypairs_alone():
    from kvmesh.events.curve import generate_keypair

    public, secret = generate_keypair()
    events = SubscriberConfig(curve_public_key=public, curve_secret_key=secret)
    seed = key_seed(INTERNAL_KEY)
    a, b = _router(seed), _router(seed)
    loop = asyncio.get_running_loop()
    sync_a = RouterSync(a, SyncConfig(bind="tcp://127.0.0.1:0"), events, MAX_KEYS, loop).start()
    sync_b = RouterSync(b, SyncConfig(peers=(sync_a.endpoint,)), events, MAX_KEYS, loop).start()
    stranger = zmq.Context.instance().socket(zmq.SUB)  # no keys: completes no handshake
    stranger.setsockopt(zmq.SUBSCRIBE, b"")
    stranger.connect(sync_a.endpoint)
    try:
        await _told(a, b, "r0", _keys(a), 100)  # the keypair's router takes the choices
        await asyncio.sleep(0.2)
        assert stranger.poll(0) == 0, "a subscriber without the keypair read the stream"
    finally:
        stranger.close(linger=0)
        sync_b.close()
        sync_a.close()


async def test_a_router_of_another_key_seed_counts_the_bookings_but_not_the_keys():
    a, b, sync_a, sync_b = await _pair(seed_b=key_seed("another cluster's internal key"))
    try:
        keys = _keys(a)
        await _told(a, b, "r0", keys, 100)
        assert b.index.match(keys).get("r0", 0) == 0
        assert sum(p["foreign_keys"] for p in sync_b.counters()["peers"].values()) >= 1
    finally:
        sync_b.close()
        sync_a.close()


async def test_a_hostile_peer_is_refused_and_bounded_while_the_loop_keeps_its_pace():
    seed = key_seed(INTERNAL_KEY)
    b = _router(seed)
    loop = asyncio.get_running_loop()
    ctx = zmq.Context.instance()
    liar = ctx.socket(zmq.PUB)
    port = liar.bind_to_random_port("tcp://127.0.0.1")
    config = SyncConfig(peers=(f"tcp://127.0.0.1:{port}",), choices_per_s=2000.0, choice_burst=200)
    sync = RouterSync(b, config, SubscriberConfig(), MAX_KEYS, loop).start()
    check_b = key_check(seed)

    def send(message: RouterChoices | bytes) -> None:
        liar.send_multipart((TOPIC, message if isinstance(message, bytes) else encode_choices(message)))

    try:
        await _until(lambda: sync.counters()["peers"])
        await asyncio.sleep(0.3)  # the SUB joins
        send(b"\xc1 not msgpack")
        send(RouterChoices("liar", 1, check_b, [RouterChoice("r0", 1, 1 << 40, [])]))  # refused: out of range
        send(RouterChoices("liar", 2, check_b, [RouterChoice("r0", 1, 5, list(range(MAX_KEYS + 1)))]))  # refused
        send(RouterChoices(b.loads.router_id, 3, check_b, [RouterChoice("r0", 9, 5000, [])]))  # b's own id
        send(RouterChoices("liar", 4, check_b, [RouterChoice("no-such-replica", 1, 5, [])]))
        liar.send_multipart((b"other topic", b"x"))  # filtered out by the SUB: never read
        liar.send_multipart((TOPIC, b"a", b"b"))  # three frames
        await _until(lambda: _peer(sync)["refused"] >= 2 and _peer(sync)["bad_frames"] >= 2
                     and sync.counters()["unknown_replica"] >= 1)
        load = b.loads.loads["r0"]
        assert (load.unacked_requests, load.prefill_backlog) == (0, 0)  # nothing of the lies counted

        # a flood: 20,000 choices as fast as the socket takes them; the loop is timed meanwhile
        lags: list[float] = []

        async def ticker() -> None:
            for _ in range(100):
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - t - 0.01)

        tick = asyncio.create_task(ticker())
        keys = _keys(b)
        t0 = time.monotonic()
        for n in range(20_000):
            try:
                liar.send_multipart((TOPIC, encode_choices(RouterChoices(
                    "liar", 10 + n, check_b, [RouterChoice("r1", 10 + n, 10, keys)]))), zmq.NOBLOCK)
            except zmq.Again:
                await asyncio.sleep(0)
        await tick
        elapsed = time.monotonic() - t0
        taken = _peer(sync)["choices"]
        print(f"flood: {taken} choices taken in {elapsed:.2f} s, loop lag max {max(lags):.4f} s")
        assert taken <= 200 + 2000 * (elapsed + 0.5)  # within the budget (burst + rate), whatever was sent
        assert max(lags) < 0.5, f"the loop stalled {max(lags):.3f} s under the flood"
        load = b.loads.loads["r1"]
        assert load.unacked_prefill_tokens <= 10 * taken  # only what passed, 10 tokens each

        # full frames (64 choices, a prompt's worth of keys each) cost as many choices and their keys besides
        while True:  # the flood's queue drained first (its frames cost less)
            before = _peer(sync)["choices"]
            await asyncio.sleep(0.3)
            if _peer(sync)["choices"] == before:
                break
        t0 = time.monotonic()
        full = [RouterChoice("r0", 0, 10, list(range(MAX_KEYS))) for _ in range(MAX_CHOICES_PER_FRAME)]
        for n in range(300):
            try:
                liar.send_multipart((TOPIC, encode_choices(RouterChoices("liar", 30_000 + n, check_b, full))),
                                    zmq.NOBLOCK)
            except zmq.Again:
                await asyncio.sleep(0)
        await asyncio.sleep(1.0)
        units = (_peer(sync)["choices"] - before) * (1 + MAX_KEYS / 64)
        assert units <= 200 + 2000 * (time.monotonic() - t0 + 0.5) + (1 + MAX_KEYS / 64) * MAX_CHOICES_PER_FRAME
    finally:
        sync.close()
        liar.close(linger=0)


def _peer(sync: RouterSync) -> dict[str, int]:
    (counters,) = sync.counters()["peers"].values()
    return counters


async def test_routers_that_follow_each_other_take_turns_by_their_endpoints_order():
    """Each ranks its own and the followed endpoints alike (router/control/turns.py): at any instant the two wait for
    different turns, a turn apart at least; alone (no peer) a router waits for no one. Waits show on /metrics."""
    seed = key_seed(INTERNAL_KEY)
    loop = asyncio.get_running_loop()
    turn = SyncConfig().turn_s
    sync_a = RouterSync(_router(seed), SyncConfig(bind="tcp://127.0.0.1:0"), SubscriberConfig(), MAX_KEYS, loop)
    sync_a.start()
    sync_b = RouterSync(_router(seed), SyncConfig(bind="tcp://127.0.0.1:0", peers=(sync_a.endpoint,)),
                        SubscriberConfig(), MAX_KEYS, loop).start()
    try:
        assert sync_a.turn_wait(100.0) == 0.0  # no peer yet
        sync_a.set_peers([sync_b.endpoint, sync_a.endpoint])  # its own endpoint among them is skipped
        first = min((sync_a, sync_b), key=lambda s: s.endpoint)
        for i in range(50):
            now = 100.0 + i * 0.00013
            at_a, at_b = now + sync_a.turn_wait(now), now + sync_b.turn_wait(now)
            assert abs(at_a - at_b) >= turn / 2 - 1e-9 and max(at_a, at_b) - now <= 2 * turn + 1e-9
        start = turn * 4000  # an even turn's start: the first's
        assert first.turn_wait(start) == 0.0 and (sync_b if first is sync_a else sync_a).turn_wait(start) > 0
        for i in range(200):  # taking its turn: never before it, however early the loop's timer fires
            await asyncio.sleep(0.0007)  # moments spread over the round, some outside its turn (a wait counted)
            before = time.time()
            wait = sync_a.turn_wait(before)
            await sync_a.take_turn()
            assert time.time() >= before + wait - 1e-4
            if i >= 19 and sync_a.counters()["turn_waits"] > 0:
                break
        counters = sync_a.counters()
        assert counters["turn_waits"] > 0 and counters["turn_wait_seconds"] > 0
        samples = {(m.labels["peer"], m.labels["counter"]) for m in _sync_family(counters).samples}
        assert ("", "turn_waits") in samples
    finally:
        sync_b.close()
        sync_a.close()


async def test_a_request_cancelled_while_it_waits_for_its_turn_leaves_nothing_behind():
    """A client that leaves during the wait (the door cancels its coroutine): the wait ends at once, nothing was booked
    and nothing is sent; the next request waits as any does."""
    seed = key_seed(INTERNAL_KEY)
    loop = asyncio.get_running_loop()
    router = _router(seed)
    sync = RouterSync(router, SyncConfig(bind="tcp://127.0.0.1:0", peers=("tcp://127.0.0.1:9",), turn_s=0.5),
                      SubscriberConfig(), MAX_KEYS, loop).start()
    try:
        while sync.turn_wait() < 0.2:  # a wait long enough to cancel inside
            await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(sync.take_turn())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert sync.counters()["published"] == 0
        assert all(load.in_flight == 0 and load.unacked_requests == 0 for load in router.loads.loads.values())
    finally:
        sync.close()
