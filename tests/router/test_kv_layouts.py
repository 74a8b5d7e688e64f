"""A fleet halfway through a KV dtype rollout: the router pairs only replicas whose KV layouts match
(router/replicas/kv_share.py). No peer pull and no prefill/decode split is planned across layouts, the route receipt
says why, and a replica advertising a missing, malformed or oversized layout is paired with none (logged)."""

from __future__ import annotations

import logging

import pytest
from kvmesh.router.control.probes import say_layout_problem
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import PullPriors, can_pull
from kvmesh.router.routing.kv_placement import SPLIT_LAYOUT
from kvmesh.router.routing.kv_router import KVRouter
from kvmesh.router.routing.policies import get_policy
from kvmesh.router.routing.receipts import HEADER_KV_NOT_SHARED
from kvmesh.router.routing.routable import COLUMNS_FROM

from .helpers import LAYOUT, stored
from .test_kv_transfer_decisions import BS, PROMPT, TRANSFER, make_router, report

FP8 = dict(LAYOUT, dtype="float8_e4m3fn", scales_digest="0123456789abcdef")
OTHER_SCALES = dict(FP8, scales_digest="fedcba9876543210")


def on(layout: object) -> dict:
    """``/load``'s ``kv_transfer`` of a replica with transfer on and ``layout``."""
    return dict(TRANSFER, layout=layout)


def fleet(layouts: dict[str, object], roles: dict[str, str] | None = None):
    """A router in front of replicas with these layouts (role ``both`` unless named)."""
    router = make_router({rid: (roles or {}).get(rid, "both") for rid in layouts})
    for rid, layout in layouts.items():
        router.loads.loads[rid].update_transfer(on(layout))
    return router


def busy_holder(layouts: dict[str, object], holders: dict[str, int]):
    """``holders`` hold that many leading blocks of the prompt and are busy: cache_aware sends it elsewhere."""
    router = fleet(layouts)
    for rid, blocks in holders.items():
        router.apply_events(rid, [stored(PROMPT, BS, num_blocks=blocks)])
        router.loads.loads[rid].update_report(report(running=500))
    return router


def test_an_fp8_replica_never_pulls_from_a_bf16_one_and_the_receipt_says_why():
    decision = busy_holder({"bf16": LAYOUT, "fp8": FP8}, {"bf16": 32}).route(PROMPT)
    assert decision.replica_id == "fp8" and decision.pull is None
    why = decision.receipt.kv_not_shared
    assert why == "the KV layout of bf16 differs from fp8's: dtype bfloat16 on bf16 vs float8_e4m3fn on fp8; " \
                  "scales_digest none on bf16 vs 0123456789abcdef on fp8"
    assert decision.receipt.headers()[HEADER_KV_NOT_SHARED] == why
    assert decision.receipt.log_fields()["kv_not_shared"] == why


def test_the_same_fleet_with_one_layout_pulls_and_says_nothing():
    decision = busy_holder({"a": FP8, "b": FP8}, {"a": 32}).route(PROMPT)
    assert decision.pull.holder.id == "a" and decision.receipt.kv_not_shared is None
    assert HEADER_KV_NOT_SHARED not in decision.receipt.headers()


def test_other_fp8_scales_are_another_layout():
    decision = busy_holder({"a": FP8, "b": OTHER_SCALES}, {"a": 32}).route(PROMPT)
    assert decision.pull is None
    assert decision.receipt.kv_not_shared == "the KV layout of a differs from b's: scales_digest 0123456789abcdef " \
                                             "on a vs fedcba9876543210 on b"


def test_the_pull_comes_from_the_best_holder_of_the_chosen_replicas_layout():
    router = busy_holder({"fp8": FP8, "bf16": LAYOUT, "chosen": LAYOUT}, {"fp8": 32, "bf16": 20})
    decision = router.route(PROMPT)
    assert decision.replica_id == "chosen"
    assert decision.pull.holder.id == "bf16" and decision.pull.num_tokens == 20 * BS
    assert decision.receipt.kv_not_shared.startswith("the KV layout of fp8 differs from chosen's")


def test_the_policy_prices_no_pull_across_layouts():
    bf16, fp8 = ReplicaLoad(), ReplicaLoad()
    bf16.update_transfer(on(LAYOUT))
    fp8.update_transfer(on(FP8))
    priors = PullPriors(True, 1e9)
    assert can_pull(bf16, bf16, priors) and not can_pull(bf16, fp8, priors) and not can_pull(fp8, bf16, priors)


@pytest.mark.parametrize("busy", [0, COLUMNS_FROM])
@pytest.mark.parametrize("policy", ["cache_aware", "cache_aware_tokens"])
def test_a_pricing_policy_credits_a_pull_only_from_a_holder_of_the_candidates_layout(policy, busy):
    """The holder is busy: a pull makes ``alike`` cheaper than computing the prompt, ``other`` (bf16) cannot pull
    from the FP8 holder and computes it all, so the policy picks ``alike`` (were both credited, a tie). With
    ``busy`` more (busy, bf16) replicas the fleet is priced in one vectorised pass (router/routing/routable.py)."""
    router = KVRouter(block_size=BS, predict_ttl_s=0.0, policy=get_policy(policy, block_size=BS))
    layouts = {"holder": FP8, "other": LAYOUT, "alike": FP8} | {f"busy{i}": LAYOUT for i in range(busy)}
    for rid, layout in layouts.items():
        router.add_replica(rid)
        router.loads.loads[rid].update_report(report(running=0 if rid in ("other", "alike") else 500))
        router.loads.loads[rid].update_transfer(on(layout))
    router.apply_events("holder", [stored(PROMPT, BS)])
    for _ in range(3):
        decision = router.route(PROMPT, commit=False)
        assert decision.replica_id == "alike" and decision.pull.holder.id == "holder"


# ---------------------------------------------------------------- the split
def test_no_split_to_a_prefill_replica_of_another_layout_and_the_receipt_says_why():
    router = fleet({"p": FP8, "d": LAYOUT}, roles={"p": "prefill", "d": "decode"})
    decision = router.route(PROMPT)
    choice = router.choose_split(decision)
    assert (choice.prefill, choice.skipped) == (None, SPLIT_LAYOUT)
    assert choice.why == "the KV layout of p differs from d's: dtype float8_e4m3fn on p vs bfloat16 on d; " \
                         "scales_digest 0123456789abcdef on p vs none on d"


def test_the_split_goes_to_the_prefill_replica_of_the_decode_replicas_layout():
    router = fleet({"p8": FP8, "p16": LAYOUT, "d": LAYOUT}, roles={"p8": "prefill", "p16": "prefill", "d": "decode"})
    router.loads.loads["p16"].update_report(report(waiting_prefill=3000))  # busier, but the only one that fits
    choice = router.choose_split(router.route(PROMPT))
    assert choice.prefill.id == "p16" and choice.skipped is None


# ---------------------------------------------------------------- hostile layouts
HOSTILE = {
    "missing": (None, "gives no kv_transfer.layout"),
    "not an object": ("bf16", "kv_transfer.layout is malformed (Expected `object`, got `str`)"),
    "wrong type": (dict(LAYOUT, block_size="16"), "Expected `int`, got `str` - at `$.block_size`"),
    "huge string": (dict(LAYOUT, dtype="x" * 1_000_000), "Expected `str` of length <= 64 - at `$.dtype`"),
    "huge number": (dict(LAYOUT, tp_size=1 << 80), "at `$.tp_size`"),
    "control characters": (dict(LAYOUT, model="m\r\nx-evil: 1"), "at `$.model`"),
    "field missing": ({k: v for k, v in LAYOUT.items() if k != "dtype"}, "missing required field `dtype`"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_replica_with_an_unusable_layout_is_paired_with_none_and_said_why(case, caplog):
    layout, said = HOSTILE[case]
    router = busy_holder({"holder": LAYOUT, "bad": LAYOUT}, {"holder": 32})
    bad = router.replicas.get("bad")
    with caplog.at_level(logging.WARNING):
        bad.load.update_transfer(on(layout))
        say_layout_problem(bad, None)
    assert not bad.load.kv_transfer_enabled and bad.kv_layout is None and said in bad.load.kv_layout_problem
    assert len(bad.load.kv_layout_problem) < 300 and "replica bad is paired with no replica" in caplog.text
    decision = router.route(PROMPT)
    assert decision.replica_id == "bad" and decision.pull is None
    assert decision.receipt.kv_not_shared.startswith("bad is paired with no replica: ")
    assert "\n" not in decision.receipt.headers()[HEADER_KV_NOT_SHARED]


def test_a_holder_with_an_unusable_layout_hands_nothing_over():
    router = busy_holder({"bad": LAYOUT, "chosen": LAYOUT}, {"bad": 32})
    router.loads.loads["bad"].update_transfer(on({"dtype": 7}))
    decision = router.route(PROMPT)
    assert decision.replica_id == "chosen" and decision.pull is None
    assert decision.receipt.kv_not_shared.startswith("bad is paired with no replica: its kv_transfer.layout is")


def test_a_prefill_replica_with_an_unusable_layout_gets_no_split():
    router = fleet({"p": LAYOUT, "d": LAYOUT}, roles={"p": "prefill", "d": "decode"})
    router.loads.loads["p"].update_transfer(on(None))
    choice = router.choose_split(router.route(PROMPT))
    assert (choice.prefill, choice.skipped) == (None, SPLIT_LAYOUT) and choice.why.startswith("p is paired with no")


def test_the_problem_is_logged_once_and_its_end_too(caplog):
    router = fleet({"r": LAYOUT})
    replica = router.replicas.get("r")
    with caplog.at_level(logging.INFO):
        for layout in (None, None, LAYOUT):
            before = replica.load.kv_layout_problem
            replica.load.update_transfer(on(layout))
            say_layout_problem(replica, before)
    assert caplog.text.count("is paired with no replica") == 1
    assert "replica r advertises a usable KV layout again" in caplog.text and replica.load.kv_transfer_enabled


def test_transfer_off_needs_no_layout_and_says_nothing():
    load = ReplicaLoad()
    load.update_transfer({"enabled": False})
    assert (load.kv_transfer_enabled, load.kv_layout, load.kv_layout_problem) == (False, None, None)
