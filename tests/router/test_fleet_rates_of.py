"""FleetRates.of: each rate is the slowest any load measured (``_slowest`` over the loads), whatever they report:
None, 0, negative, NaN or infinite rates included."""

from __future__ import annotations

import math
import random

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost.fleet import FleetRates, _slowest

RATES = [None, 0, 0.0, -1.0, float("nan"), float("inf"), 1e-9, 1.0, 3, 5.0, 1234.5]


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_each_rate_is_the_slowest_measured():
    rng = random.Random(3)
    for _ in range(5000):
        loads = []
        for _ in range(rng.randrange(0, 5)):
            load = ReplicaLoad()
            load.prefill_tokens_per_s, load.h2d_bytes_per_s, load.pull_bytes_per_s = (rng.choice(RATES)
                                                                                      for _ in range(3))
            loads.append(load)
        expected = [None, None, None]
        for load in loads:
            for i, rate in enumerate((load.prefill_tokens_per_s, load.h2d_bytes_per_s, load.pull_bytes_per_s)):
                expected[i] = _slowest(expected[i], rate)
        fleet = FleetRates.of(loads)
        got = (fleet.prefill_s_per_token, fleet.h2d_s_per_byte, fleet.pull_s_per_byte)
        assert all(_same(g, e) for g, e in zip(got, expected, strict=True)), (got, expected)


def test_the_slowest_of_two_measured_rates():
    fast, slow = ReplicaLoad(), ReplicaLoad()
    fast.prefill_tokens_per_s, slow.prefill_tokens_per_s = 4000.0, 1000.0
    assert FleetRates.of([fast, slow]).prefill_s_per_token == 1 / 1000.0
    assert FleetRates.of([]).prefill_s_per_token is None
