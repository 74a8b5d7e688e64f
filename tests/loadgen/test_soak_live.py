"""``kvmesh bench soak`` for a few seconds against its real processes (a router and two stories260K replicas): the
results file holds memory samples of all three, every well-formed request of the mix completed, every hostile one got
a clean 4xx, and the plot is written. The half-hour run is ``kvmesh bench soak`` (BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.soak import main

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_a_short_soak_samples_every_process_and_no_well_formed_request_fails(stories_path, tmp_path):
    out = tmp_path / "soak.json"
    code = main(["--duration", "8", "--warmup", "3", "--window", "3", "--sample-s", "1", "--think-s", "0",
                 "--model", str(stories_path), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["requests"]["well_formed_failed"] == 0, result["tally"]["failure_reasons"]
    assert result["requests"]["hostile_misanswered"] == 0, result["tally"]["failure_reasons"]
    assert result["requests"]["well_formed_sent"] >= 3 and result["verdict"]["exited"] == []
    names = {"router", "replica-0", "replica-1"}
    assert all(set(s["rss_mb"]) == names for s in result["samples"]) and len(result["samples"]) >= 6
    assert all(v > 50 for s in result["samples"] for v in s["rss_mb"].values())  # each a loaded process
    assert set(result["verdict"]["processes"]) == names
    assert code == (0 if result["verdict"]["ok"] else 1)  # growth over 8 s is the warm-up's: not asserted here
    assert out.with_suffix(".png").stat().st_size > 10_000
