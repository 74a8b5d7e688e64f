"""Generated multi-turn traces share prefixes the way the Mooncake format says."""

from __future__ import annotations

from kvmesh.cluster.measure.sim.replica import requests_from_mooncake
from kvmesh.cluster.measure.sim.report import infinite_hit_rate
from kvmesh.cluster.measure.workloads.generated import SyntheticTrace


def test_turns_extend_their_conversation_and_tenants_share_system_prompts():
    shape = SyntheticTrace(num_requests=60, num_tenants=2, system_blocks=3, turn_blocks=2, turns=3, think_s=0.0)
    recs = shape.records()
    assert len(recs) == 60
    assert [r.timestamp_ms for r in recs] == sorted(r.timestamp_ms for r in recs)
    assert len({r.hash_ids[:3] for r in recs}) == 2
    by_first_turn = {}
    for r in recs:
        by_first_turn.setdefault(r.hash_ids[:5], []).append(r.hash_ids)
    for chain in by_first_turn.values():
        for a, b in zip(chain, chain[1:], strict=False):
            assert b[: len(a)] == a and len(b) == len(a) + 2
    assert all(r.input_length == 512 * len(r.hash_ids) for r in recs)
    assert infinite_hit_rate(requests_from_mooncake(recs), 512) > 0.5
