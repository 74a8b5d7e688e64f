"""Another router's held prediction (router/routing/peer_holds.py, told over router/control/router_sync.py): with
``predict_hold_s`` the blocks a router sent are held on the other routers too, past ``predict_ttl_s`` until the
sending router says the replica answered, then ``predict_ttl_s`` more; what a peer says is bounded."""

from __future__ import annotations

import asyncio
import time

import msgspec
from kvmesh.events.config import SubscriberConfig
from kvmesh.events.publish.load_ledger import LoadLedger
from kvmesh.router.config import RouterConfig, SyncConfig, build_router
from kvmesh.router.control.router_sync import RouterSync
from kvmesh.router.control.sync_wire import RouterChoice, RouterChoices, check, decode_choices, encode_choices, key_seed
from kvmesh.router.routing.peer_holds import PeerHolds

from .test_router_sync import INTERNAL_KEY, MAX_KEYS, _keys, _until

TTL_S, HOLD_S = 0.3, 30.0


class OldChoice(msgspec.Struct, array_like=True, frozen=True):
    """A choice as a router of a version without ``hold`` reads it."""

    replica_id: str
    booking: int
    uncached_tokens: int
    keys: list[int]


class OldChoices(msgspec.Struct, array_like=True, frozen=True):
    router_id: str
    seq: int
    key_check: int
    choices: list[OldChoice]


def _router(hold_s: float = HOLD_S):
    router = build_router(RouterConfig(predict_ttl_s=TTL_S, predict_hold_s=hold_s), seed=key_seed(INTERNAL_KEY))
    for rid in ("r0", "r1"):
        router.add_replica(rid)
        router.loads.apply_published(router.replicas.get(rid), LoadLedger().update(0.0, 0.0, 0, 0, 0, 0.0))
    return router


def test_a_peers_hold_lasts_until_its_release_then_the_ttl():
    router = _router()
    holds, keys = PeerHolds(router), _keys(router)
    holds.hold("router-a", 1, router.replicas.get("r1"), keys, now=100.0)
    assert router.index.match(keys, now=100.0 + 10 * TTL_S)["r1"] == len(keys)  # held past the TTL
    holds.release("router-a", 1, now=110.0)
    holds.release("router-a", 1, now=110.0)  # twice: harmless
    assert router.index.match(keys, now=110.0 + TTL_S / 2)["r1"] == len(keys)
    assert router.index.match(keys, now=110.0 + 2 * TTL_S).get("r1", 0) == 0
    assert len(holds) == 0


def test_a_router_without_a_hold_of_its_own_takes_a_peers_hold_as_a_plain_prediction():
    router = _router(hold_s=0.0)
    holds, keys = PeerHolds(router), _keys(router)
    holds.hold("router-a", 1, router.replicas.get("r1"), keys, now=100.0)
    assert router.index.match(keys, now=100.0)["r1"] == len(keys)
    assert router.index.match(keys, now=100.0 + 2 * TTL_S).get("r1", 0) == 0 and len(holds) == 0


def test_a_peer_that_never_releases_holds_at_most_its_bound_and_the_backstop():
    router = _router()
    holds = PeerHolds(router, max_holds=4)
    prompts = [router.hasher.keys(list(range(1000 * i, 1000 * i + 64))) for i in range(6)]
    for number, keys in enumerate(prompts, 1):
        holds.hold("liar", number, router.replicas.get("r0"), keys, now=100.0)
    assert len(holds) == 4  # the two oldest released: they last the TTL
    late = 100.0 + 2 * TTL_S
    assert [router.index.match(keys, now=late).get("r0", 0) > 0 for keys in prompts] == [False] * 2 + [True] * 4
    assert all(router.index.match(keys, now=100.0 + HOLD_S + 1).get("r0", 0) == 0 for keys in prompts)


def test_a_hold_number_out_of_range_is_refused_at_intake_and_an_older_router_reads_the_rest():
    check(RouterChoices("a", 1, 7, [RouterChoice("r0", 0, 0, [], 5)]), MAX_KEYS)
    for bad in (-1, 1 << 53):
        try:
            check(RouterChoices("a", 1, 7, [RouterChoice("r0", 0, 0, [], bad)]), MAX_KEYS)
        except ValueError as e:
            assert "hold" in str(e)
        else:
            raise AssertionError(f"hold {bad} passed")
    held = encode_choices(RouterChoices("a", 1, 7, [RouterChoice("r0", 3, 30, [1, 2], 9)]))
    assert decode_choices(held).choices[0].hold == 9
    old = msgspec.msgpack.decode(held, type=OldChoices)
    assert old.choices == [OldChoice("r0", 3, 30, [1, 2])]
    assert decode_choices(msgspec.msgpack.encode(old)).choices[0].hold == 0  # and its choices read as plain here


async def test_over_the_stream_a_prompt_still_computed_stays_held_on_the_other_router_until_answered():
    a, b = _router(), _router()
    loop = asyncio.get_running_loop()
    sync_a = RouterSync(a, SyncConfig(bind="tcp://127.0.0.1:0"), SubscriberConfig(), MAX_KEYS, loop).start()
    sync_b = RouterSync(b, SyncConfig(peers=(sync_a.endpoint,)), SubscriberConfig(), MAX_KEYS, loop).start()
    try:
        keys = _keys(a)
        end = time.monotonic() + 5.0
        holds = []
        while len(sync_b.peer_holds) == 0:  # a SUB joins a moment after it connects: tell again until one lands
            assert time.monotonic() < end, "the other router never held the choice"
            holds.append(a.choices_out(a.replicas.get("r1"), 0, 300, keys, True))
            await asyncio.sleep(0.05)
        assert all(holds) and len(set(holds)) == len(holds)  # each held choice numbered apart
        await asyncio.sleep(2 * TTL_S)  # past the TTL: a plain prediction would be gone
        assert b.index.match(keys)["r1"] == len(keys)
        for hold in holds:
            a.holds_out(a.replicas.get("r1"), hold)
        await _until(lambda: len(sync_b.peer_holds) == 0)
        assert b.index.match(keys)["r1"] == len(keys)  # released: the TTL from now
        await _until(lambda: b.index.match(keys).get("r1", 0) == 0, timeout_s=5 * TTL_S + 1)
    finally:
        sync_b.close()
        sync_a.close()
