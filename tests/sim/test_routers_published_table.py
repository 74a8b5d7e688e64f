"""The published-load table (``kvmesh bench report``, kind ``routers_published``): each router count against one
router on the same arrivals, as a share of the single pool and of mean TTFT, judged over the seeds."""

from __future__ import annotations

import pytest
from kvmesh.cluster.measure.benchmarks.support.routers_published_table import table

CONFIG = {"published_loads": True, "load_publish_interval_s": 0.005, "load_publish_lag_s": 0.001}


def _doc(hits: dict[int, float], ttfts: dict[int, float], pool: float = 0.5) -> dict:
    runs = {f"cache_aware_tokens/{n}r": {"policy": "cache_aware_tokens", "num_routers": n, "hit_rate": hits[n],
                                         "ttft_s": {"mean": ttfts[n], "p99": 4 * ttfts[n]}} for n in hits}
    return {"config": CONFIG, "ceilings": {"single_pool_hit_rate": pool}, "policies": runs,
            "trace": {"arrivals": "arrival seed 0: each stamp's requests arrive together"}}


def _rows(text: str) -> dict[str, str]:
    return {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}


def test_each_router_count_is_judged_against_one_router_on_the_same_seeds():
    docs = [_doc({1: 0.40, 4: 0.40 - 0.0005 * k, 16: 0.30}, {1: 1.0, 4: 1.0 + 0.001 * k, 16: 1.5}) for k in range(10)]
    rows = _rows(table(docs))
    assert "80.0%" in rows["1"] and rows["1"].endswith("| |")
    assert rows["4"].endswith("| pass |")  # -0.9 points of the pool's share at most, +0.9% TTFT at most
    assert "-20.0 pt" in rows["16"] and "+50.0%" in rows["16"] and rows["16"].endswith("| fail |")
    assert "arrive together" in table(docs) and "cache_aware_tokens" in table(docs)


def test_an_interval_across_the_margin_is_undecided():
    docs = [_doc({1: 0.40, 4: 0.40}, {1: 1.0, 4: 1.05 + (0.08 if k % 2 else -0.08)}) for k in range(10)]
    assert _rows(table(docs))["4"].endswith("| undecided |")


def test_reports_without_the_pool_or_without_one_router_are_refused():
    no_pool = _doc({1: 0.4, 4: 0.4}, {1: 1.0, 4: 1.0})
    no_pool["ceilings"] = {}
    with pytest.raises(ValueError, match="single pool"):
        table([no_pool])
    with pytest.raises(ValueError, match="--routers 1"):
        table([_doc({4: 0.4, 16: 0.4}, {4: 1.0, 16: 1.0})])


def test_routers_that_see_each_others_choices_at_once_are_tabled_as_such():
    shared = {"share_loads": True, "share_predictions": True}
    docs = [{**_doc({1: 0.40, 4: 0.40}, {1: 1.0, 4: 1.0}), "config": shared} for _ in range(3)]
    text = table(docs)
    assert "every router's requests sent there that have not finished and the blocks each predicted there" in text
    assert "published at once" not in text


def test_seeds_run_with_different_views_or_none_are_refused():
    published, shared = _doc({1: 0.4, 4: 0.4}, {1: 1.0, 4: 1.0}), _doc({1: 0.4, 4: 0.4}, {1: 1.0, 4: 1.0})
    shared["config"] = {"share_loads": True}
    with pytest.raises(ValueError, match="different views"):
        table([published, shared])
    blind = _doc({1: 0.4, 4: 0.4}, {1: 1.0, 4: 1.0})
    blind["config"] = {}
    with pytest.raises(ValueError, match="saw nothing of each other"):
        table([blind])
