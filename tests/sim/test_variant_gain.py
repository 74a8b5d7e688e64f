"""``variant_gain`` tables (cluster/measure/benchmarks/support/variant_gain.py): a variant of the default paired with
the default's own runs of the same seeds, read from the file the variant names; a cell still running is left out, and
a variant seed the default never ran is an error, not a row paired on fewer seeds."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.report import render
from kvmesh.cluster.measure.benchmarks.support.variant_gain import table

D = "cache_aware_tokens"


def _figures(hit: float, mean: float) -> dict:
    return {D: {"hit_share": hit, "ttft_mean": mean, "good_share": 0.9, "ttft_p50": 1.0, "ttft_p99": 2.0},
            "llmd": {"hit_share": 0.5, "ttft_mean": 1.0, "good_share": 0.9, "ttft_p50": 1.0, "ttft_p99": 2.0}}


def _files(tmp_path, variant_means, seeds=("0", "1", "2")):
    source = {"default": D, "policies": [D, "llmd"],
              "cells": {"w/2x/none": {"seeds": {k: _figures(0.90, 1.0) for k in ("0", "1", "2")}, "command": "x"}}}
    runs = {k: _figures(0.91, m) for k, m in zip(seeds, variant_means, strict=True)}
    variant = {"default": D, "policies": [D, "llmd"], "variant_of": "results/source.json",
               "policy_kwargs": ["queue_share_weight=0.3"], "router_kwargs": [],
               "cells": {"w/2x/none": {"seeds": runs, "command": "x"},
                         "v/2x/none": {"seeds": {"0": _figures(0.9, 1.0)}, "command": "x",
                                       "refreshing": {"policies": [D], "seeds": []}}}}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "source.json").write_text(json.dumps(source))
    (tmp_path / "results" / "variant.json").write_text(json.dumps(variant))
    return variant


def test_the_variant_is_paired_with_the_defaults_runs_of_its_seeds(tmp_path):
    variant = _files(tmp_path, (0.80, 0.90, 0.85))
    text = table([variant], tmp_path)
    row = next(line for line in text.splitlines() if "w/2x/none" in line)
    assert row.startswith("| queue_share_weight=0.3 | w/2x/none | 3 | **+1.0 pt [+1.0, +1.0]** | **-15.0% [")
    assert "v/2x/none" not in text  # still running
    assert text.endswith("the default's runs from results/source.json.")


def test_a_generated_block_is_rendered_from_the_checkout(tmp_path):
    _files(tmp_path, (0.99, 1.0, 1.01))
    block = "<!-- table: variant_gain results/variant.json -->\nstale\n<!-- /table -->\n"
    text, changed = render(block, tmp_path)
    assert changed == ["variant_gain results/variant.json"]
    assert "| w/2x/none | 3 | **+1.0 pt [+1.0, +1.0]** | +0.0% [-2.5, +2.5] |" in text  # within the margin: plain


def test_a_variant_seed_the_default_never_ran_is_an_error(tmp_path):
    variant = _files(tmp_path, (1.0, 1.0, 1.0), seeds=("0", "1", "7"))
    with pytest.raises(ValueError, match="seeds 7 of the variant are not in results/source.json"):
        table([variant], tmp_path)
