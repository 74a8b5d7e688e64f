"""``kvmesh bench sync_lag``: two routers in two processes over loopback, every measured choice applied and timed."""

from __future__ import annotations

import json

import pytest
from kvmesh.cluster.measure.benchmarks.report.kinds import RENDERERS
from kvmesh.cluster.measure.benchmarks.sync_lag import main

pytestmark = pytest.mark.live


def test_the_follower_applies_every_measured_choice_and_the_lag_is_reported(tmp_path):
    out = tmp_path / "lag.json"
    assert main(["--choices", "100", "--interval-ms", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sent"] == 100 and result["applied"] + result["lost"] == 100 and result["applied"] >= 90
    lag = result["lag_ms"]
    assert 0 < lag["p50"] <= lag["p90"] <= lag["p99"] <= lag["max"] < 30_000
    assert result["command"].startswith("kvmesh bench sync_lag --choices 100")
    assert "| 100 (64, 1 ms) |" in RENDERERS["sync_lag"](result)
