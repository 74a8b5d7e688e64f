"""KVRouter.commit credits a priced decision exactly as matching the index again would: it reuses the decision's
match while the index's version holds and no prediction is due, and matches again otherwise."""

from __future__ import annotations

import random
from dataclasses import replace

from kvmesh.router.routing.kv_router import KVRouter

from .helpers import removed, stored

BS = 4


def _router() -> KVRouter:
    router = KVRouter(block_size=BS, predict_ttl_s=1.0)
    for rid in ("a", "b", "c"):
        router.add_replica(rid)
    return router


def _state(router: KVRouter) -> tuple:
    index = router.index
    return (dict(index._blocks), dict(index.predictions.predicted), list(index.predictions.queue),
            {sid: router.sessions.get(sid, 100.0) for sid in ("s0", "s1", "s2")})


def _count_matches(router: KVRouter) -> list[int]:
    calls = [0]
    match = router.index.match

    def counted(*args, **kwargs):
        calls[0] += 1
        return match(*args, **kwargs)

    router.index.match = counted  # type: ignore[method-assign]
    return calls


def test_commit_equals_a_fresh_match_whatever_happens_between():
    rng = random.Random(7)
    reused, fresh = _router(), _router()  # ``fresh`` always matches again (the decision's version unknown)
    matches = _count_matches(reused)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 40))] for _ in range(12)]
    now = 0.0
    for step in range(400):
        prompt, session = rng.choice(prompts), rng.choice([None, "s0", "s1", "s2"])
        decisions = [r.route(prompt, now=now, session_id=session, commit=False) for r in (reused, fresh)]
        assert decisions[0].replica_id == decisions[1].replica_id
        between = rng.random()
        if between < 0.15:  # a replica's events arrive meanwhile (often the chosen one's, on this prompt)
            rid, other = rng.choice(["a", "b", "c", decisions[0].replica_id]), rng.choice([prompt, rng.choice(prompts)])
            events = [stored(other, BS)] if rng.random() < 0.5 else [removed(other, BS, [0])]
            for r in (reused, fresh):
                r.apply_events(rid, events)
        elif between < 0.25:  # time passes: predictions fall due
            now += rng.choice([0.3, 1.2])
        elif between < 0.3:  # a replica's cache is dropped
            rid = rng.choice("abc")
            for r in (reused, fresh):
                r.clear_cache(r.replicas.get(rid))
        reused.commit(decisions[0], session, now=now)
        fresh.commit(replace(decisions[1], index_version=-1), session, now=now)
        assert _state(reused) == _state(fresh), step
        now += 0.01
    assert 0 < matches[0] < 400  # both ways were taken


def test_on_the_clock_a_commit_reuses_the_match():
    router = _router()
    matches = _count_matches(router)
    prompt = list(range(1, 21))
    router.commit(router.route(prompt, commit=False))
    router.commit(router.route(prompt, commit=False))  # a prediction made, none due for a second
    assert matches[0] == 0
    assert router.index.match(router.hasher.keys(prompt)) == {router.route(prompt, commit=False).replica_id: 5}


def test_a_committed_route_leaves_commit_to_match_again():
    router = _router()
    matches = _count_matches(router)
    decision = router.route(list(range(1, 21)), now=0.0)  # credited: the index changed after its match
    router.commit(decision, now=0.0)
    assert matches[0] == 1


def test_a_degraded_replica_is_credited_from_what_it_holds():
    reused, fresh = _router(), _router()
    prompt = list(range(1, 41))
    for r in (reused, fresh):
        r.apply_events("a", [stored(prompt, BS, num_blocks=6)])
        r.set_degraded(r.replicas.get("a"), "stalled")
        r.set_healthy(r.replicas.get("b"), False)
        r.set_healthy(r.replicas.get("c"), False)
    decisions = [r.route(prompt, now=0.0, commit=False) for r in (reused, fresh)]
    assert decisions[0].replica_id == "a" and decisions[0].held_blocks == 6
    reused.commit(decisions[0], now=0.0)
    fresh.commit(replace(decisions[1], index_version=-1), now=0.0)
    assert _state(reused) == _state(fresh)
