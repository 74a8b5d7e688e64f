"""The verdict's statistics on hand-computed cases: the paired t-interval of default - rival over seeds and the rule
that reads it against a margin (pass, fail, undecided), per pair and per cell."""

from __future__ import annotations

import math

import pytest
from kvmesh.cluster.measure.benchmarks.support.paired_verdict import (
    FAIL,
    METRICS,
    PASS,
    UNDECIDED,
    beats,
    cell_verdict,
    judge,
    judge_cell,
    paired,
)

HIT, MEAN, GOOD, P50, P99 = METRICS
T2 = 4.303  # Student's t, 97.5%, 2 degrees of freedom


def test_the_margins_are_the_stated_ones():
    assert [(m.name, m.margin, m.primary) for m in METRICS] == [
        ("hit_share", 0.003, True), ("ttft_mean", 0.02, True), ("good_share", 0.005, True),
        ("ttft_p50", 0.03, False), ("ttft_p99", 0.05, False)]


def test_paired_interval_of_a_share_is_in_points():
    # default - rival per seed: 0.010, 0.012, 0.014 -> mean 0.012, sd 0.002, half 4.303 * 0.002 / sqrt(3)
    p = paired(HIT, [0.510, 0.512, 0.514], [0.500, 0.500, 0.500])
    half = T2 * 0.002 / math.sqrt(3)
    assert (p.mean, p.low, p.high, p.seeds) == (pytest.approx(0.012), pytest.approx(0.012 - half),
                                                pytest.approx(0.012 + half), 3)
    assert judge(HIT, p) == PASS and beats(HIT, p)  # low 0.00703 > 0.003
    assert p.describe(HIT) == "+1.2 pt [+0.7, +1.7]"


def test_a_rival_better_beyond_the_margin_fails_and_one_straddling_it_is_undecided():
    worse = paired(HIT, [0.490, 0.488, 0.486], [0.500] * 3)  # [-0.0170, -0.0070]: all below -0.003
    assert judge(HIT, worse) == FAIL and not beats(HIT, worse)
    wide = paired(HIT, [0.50, 0.52, 0.54], [0.50] * 3)  # mean 0.02, half 0.0497: [-0.0297, 0.0697] holds -0.003
    assert wide.low < -HIT.margin < wide.high
    assert judge(HIT, wide) == UNDECIDED and not beats(HIT, wide)


def test_a_share_within_the_margin_passes_without_beating():
    p = paired(GOOD, [0.498] * 4, [0.500] * 4)  # -0.2 points every seed: within 0.5 points
    assert (p.low, p.high) == (pytest.approx(-0.002), pytest.approx(-0.002))
    assert judge(GOOD, p) == PASS and not beats(GOOD, p)


def test_a_time_differs_relative_to_the_rival():
    slower = paired(MEAN, [1.1, 1.1, 1.1], [1.0, 1.0, 1.0])  # 10% slower every seed
    assert slower.mean == pytest.approx(0.1) and slower.low == pytest.approx(0.1)
    assert judge(MEAN, slower) == FAIL
    faster = paired(MEAN, [0.9, 1.8, 0.45], [1.0, 2.0, 0.5])  # 10% faster every seed, whatever the scale
    assert (faster.low, faster.high) == (pytest.approx(-0.1), pytest.approx(-0.1))
    assert judge(MEAN, faster) == PASS and beats(MEAN, faster)
    assert faster.describe(MEAN) == "-10.0% [-10.0, -10.0]"
    spread = paired(MEAN, [1.1, 1.2, 1.3], [1.0] * 3)  # 0.1, 0.2, 0.3: mean 0.2, half 4.303 * 0.1 / sqrt(3)
    assert spread.low == pytest.approx(0.2 - T2 * 0.1 / math.sqrt(3))  # -0.048 < 0.02 < 0.448
    assert judge(MEAN, spread) == UNDECIDED


def test_secondary_margins_are_wider():
    p = paired(P50, [1.025] * 3, [1.0] * 3)  # 2.5% slower: within p50's 3%, beyond mean TTFT's 2%
    assert judge(P50, p) == PASS and judge(MEAN, p) == FAIL
    assert judge(P99, paired(P99, [1.06] * 3, [1.0] * 3)) == FAIL


def test_paired_needs_the_same_seeds_on_both_sides():
    with pytest.raises(ValueError, match="2 figures of the default, 3 of the rival"):
        paired(HIT, [0.1, 0.2], [0.1, 0.2, 0.3])


def test_a_cell_fails_on_any_failing_pair_and_is_undecided_on_any_straddling_one():
    assert cell_verdict({"a": {"hit_share": PASS}, "b": {"hit_share": UNDECIDED, "ttft_mean": FAIL}}) == FAIL
    assert cell_verdict({"a": {"hit_share": PASS}, "b": {"ttft_mean": UNDECIDED}}) == UNDECIDED
    assert cell_verdict({"a": {"hit_share": PASS, "ttft_mean": PASS}}) == PASS


def _seed(mine: dict[str, float], theirs: dict[str, float]) -> dict[str, dict[str, float]]:
    return {"default": mine, "rival": theirs}


def test_judge_cell_pairs_every_metric_of_every_rival():
    base = {"hit_share": 0.9, "ttft_mean": 1.0, "good_share": 0.8, "ttft_p50": 0.5, "ttft_p99": 4.0}
    seeds = [_seed(base | {"hit_share": 0.9 + d}, base | {"ttft_p99": 4.0 * (1.2 + d)}) for d in (0.010, 0.011, 0.012)]
    j = judge_cell(seeds, "default")
    # hit: +1.0, +1.1, +1.2 points: mean 1.1, half 4.303 x 0.1 / sqrt(3) = 0.25: [+0.85, +1.35], clear of +0.3
    assert j["seeds"] == 3 and j["beaten"] == ["rival"]
    assert j["pairs"]["rival"]["hit_share"] == PASS and j["pairs"]["rival"]["ttft_mean"] == PASS
    # p99: the default's 4.0 against the rival's 4.84, 4.844, 4.848: about 17.4% faster, the rival never better
    assert j["pairs"]["rival"]["ttft_p99"] == PASS and j["verdict"] == PASS


def test_a_rival_not_yet_run_on_every_seed_is_left_out_of_the_cell():
    base = {"hit_share": 0.9, "ttft_mean": 1.0, "good_share": 0.8, "ttft_p50": 0.5, "ttft_p99": 4.0}
    seeds = [_seed(base, base) for _ in range(3)]
    seeds[0]["new"] = base | {"hit_share": 0.99}  # a refresh stopped after its first seed
    j = judge_cell(seeds, "default")
    assert list(j["pairs"]) == ["rival"] and j["seeds"] == 3
