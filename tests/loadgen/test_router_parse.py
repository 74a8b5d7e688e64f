"""``kvmesh bench router_parse``: the router's data plane without HTTP, run over its three workloads in process."""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.cluster.measure.benchmarks import router_parse


def test_each_workload_routes_to_a_replica_and_builds_its_upstream_body(stories_path):
    fwd, bodies = router_parse._setup()

    async def first(name: str):
        return await router_parse._one(fwd, bodies[name][0], router_parse.PATHS[name])

    for name in router_parse.PATHS:
        decision, body = asyncio.run(first(name))
        assert decision.replica.id in {"r0", "r1"}, name
        assert body.startswith(b"{") and (b"\"prompt\"" in body or b"\"messages\"" in body), name


@pytest.mark.slow  # a whole round: every workload's requests, first and warm
def test_a_round_reports_first_and_warm_cpu_per_request_for_every_workload(stories_path):
    out = router_parse.worker(passes=1)
    assert set(out) == set(router_parse.PATHS)
    assert all(w["first_us"] > 0 and w["warm_us"] > 0 for w in out.values()), out
