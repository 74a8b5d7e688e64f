"""PrefixIndex: matching counts leading blocks per replica, removals and clears, predictions."""

from __future__ import annotations

from kvmesh.events.schema import AllBlocksCleared
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import RouterKeyHasher

from .helpers import removed, stored

BS = 4
PROMPT = list(range(100, 140))  # 10 blocks


def make_index(ttl=2.0):
    return PrefixIndex(hasher=RouterKeyHasher(BS), predict_ttl_s=ttl)


def keys(tokens=PROMPT, **kw):
    return RouterKeyHasher(BS).keys(tokens, **kw)


def test_match_counts_leading_blocks_per_replica():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, num_blocks=3)])
    index.apply("b", [stored(PROMPT, BS, num_blocks=7)])
    assert index.match(keys()) == {"a": 3, "b": 7}


def test_child_event_continues_parent_chain():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, num_blocks=2), stored(PROMPT, BS, start_block=2, num_blocks=3)])
    assert index.match(keys()) == {"a": 5}


def test_broken_chain_stops_the_count():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, num_blocks=8)])
    index.apply("a", [removed(PROMPT, BS, [3])])
    assert index.match(keys()) == {"a": 3}


def test_no_match_for_other_prompt():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS)])
    assert index.match(keys(list(range(40)))) == {}
    assert index.match([]) == {}


def test_all_blocks_cleared_drops_only_that_replica():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS)])
    index.apply("b", [stored(PROMPT, BS, num_blocks=4)])
    index.apply("a", [AllBlocksCleared()])
    assert index.match(keys()) == {"b": 4}
    assert index.num_blocks("a") == 0


def test_remove_replica_frees_its_slot_for_reuse():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS)])
    index.remove_replica("a")
    assert index.match(keys()) == {}
    index.apply("c", [stored(PROMPT, BS, num_blocks=2)])
    assert index.match(keys()) == {"c": 2}
    assert index.num_blocks() == 2


def test_duplicate_store_needs_two_removals():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, num_blocks=2), stored(PROMPT, BS, num_blocks=2)])
    index.apply("a", [removed(PROMPT, BS, [1])])
    assert index.match(keys()) == {"a": 2}
    index.apply("a", [removed(PROMPT, BS, [1])])
    assert index.match(keys()) == {"a": 1}


def test_orphan_blocks_are_counted_not_indexed():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, start_block=2, num_blocks=2)])
    assert index.match(keys()) == {}
    assert index.stats.orphan_blocks == 2


def test_other_block_size_is_dropped():
    index = make_index()
    index.apply("a", [stored(PROMPT, 8)])
    assert index.stats.bad_block_size == 5
    assert index.num_blocks() == 0


def test_many_replicas_each_with_own_depth():
    index = make_index()
    for r in range(70):
        index.apply(r, [stored(PROMPT, BS, num_blocks=r % 11)] if r % 11 else [])
    got = index.match(keys())
    assert got == {r: r % 11 for r in range(70) if r % 11}


def test_predicted_blocks_count_until_ttl():
    index = make_index(ttl=1.0)
    index.add_replica("a")
    assert index.predict("a", keys(), now=100.0) == 10
    assert index.match(keys(), now=100.5) == {"a": 10}
    assert index.match(keys(), now=101.5) == {}
    assert index.num_blocks() == 0


def test_confirmed_prediction_survives_ttl():
    index = make_index(ttl=1.0)
    index.add_replica("a")
    index.predict("a", keys(), now=100.0)
    index.apply("a", [stored(PROMPT, BS, num_blocks=4)])
    assert index.match(keys(), now=102.0) == {"a": 4}


def test_a_held_prediction_lasts_until_its_release_and_the_ttl_after():
    index = make_index(ttl=1.0)
    index.add_replica("a")
    ticket = index.predict_held("a", keys(), now=100.0, start=0, hold_s=30.0)
    index.apply("a", [stored(PROMPT, BS, num_blocks=4)])  # the prompt's first chunk is computed
    assert index.match(keys(), now=105.0) == {"a": 10}  # past the ttl, the rest still being computed
    index.predictions.release(ticket, now=106.0)  # its first token
    assert index.match(keys(), now=106.9) == {"a": 10}
    assert index.match(keys(), now=107.1) == {"a": 4}  # what the events did not confirm goes after the ttl
    assert not index.predictions.held and index.predictions.due(200.0) is False


def test_a_held_prediction_never_released_goes_at_its_backstop():
    index = make_index(ttl=1.0)
    index.add_replica("a")
    index.predict_held("a", keys(), now=100.0, start=0, hold_s=30.0)
    assert index.predictions.due(129.9) is False and index.predictions.due(130.0) is True
    assert index.match(keys(), now=129.9) == {"a": 10}
    assert index.match(keys(), now=130.0) == {}
    assert not index.predictions.held and index.num_blocks() == 0
    index.predictions.release(1, now=131.0)  # released late (an answer after the backstop): nothing comes back
    assert index.match(keys(), now=131.1) == {}


def test_prediction_does_not_shadow_real_removal():
    index = make_index(ttl=1.0)
    index.apply("a", [stored(PROMPT, BS, num_blocks=4)])
    assert index.predict("a", keys(), now=100.0) == 6  # only the blocks it did not hold
    index.apply("a", [removed(PROMPT, BS, [3, 2, 1, 0])])
    assert index.match(keys(), now=100.1) == {}  # the prediction hangs off a broken chain
    assert index.match(keys(), now=200.0) == {}
    assert index.num_blocks() == 0 and not index._blocks


def test_orphan_is_keyed_once_its_parent_is_stored_again():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, start_block=1, num_blocks=3)])  # parent (block 0) unknown
    assert index.num_blocks("a") == 3 and index.match(keys()) == {}
    index.apply("a", [stored(PROMPT, BS, num_blocks=1)])
    assert index.match(keys()) == {"a": 4}
    assert index.stats.orphan_blocks == 3


def test_removed_orphan_is_not_adopted():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, start_block=1, num_blocks=3)])
    index.apply("a", [removed(PROMPT, BS, [2])])
    index.apply("a", [stored(PROMPT, BS, num_blocks=1)])
    assert index.match(keys()) == {"a": 2}
    assert index.num_blocks("a") == 3  # blocks 0, 1 and the still-parked 3


def test_event_with_impossible_token_ids_is_counted_not_fatal():
    index = make_index()
    bad = stored(PROMPT, BS, num_blocks=1)
    bad.token_ids = [-1] * BS
    index.apply("a", [bad, stored(PROMPT, BS, num_blocks=2)])
    assert index.stats.bad_events == 1
    assert index.match(keys()) == {"a": 2}


def test_hole_in_one_chain_does_not_affect_another_replica():
    index = make_index()
    index.apply("a", [stored(PROMPT, BS, num_blocks=8), removed(PROMPT, BS, [3])])
    index.apply("b", [stored(PROMPT, BS, num_blocks=6)])
    assert index.match(keys()) == {"a": 3, "b": 6}
