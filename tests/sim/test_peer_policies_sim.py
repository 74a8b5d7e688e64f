"""The peers' policies in ``kvmesh sim``: llm-d's scorers see scraped load (a /load poll as often as llm-d scrapes)."""

from __future__ import annotations

from kvmesh.cluster.measure.sim.config import SimConfig
from kvmesh.cluster.measure.sim.run import compare_policies
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord


def test_llmd_runs_poll_load_and_the_others_do_not():
    records = [MooncakeRecord(t * 40.0, 900, 8, tuple(range(t % 5 * 10, t % 5 * 10 + 2))) for t in range(120)]
    config = SimConfig(num_replicas=3, blocks_per_replica=64)
    report = compare_policies(records, config, ["dynamo", "llmd", "llmd_precise", "sglang"], show_progress=False,
                              with_ceilings=False)
    runs = report["policies"]
    assert runs["llmd"]["load_poll_s"] == runs["llmd_precise"]["load_poll_s"] == 0.05
    assert "load_poll_s" not in runs["dynamo"] and "load_poll_s" not in runs["sglang"]
    polled = compare_policies(records, SimConfig(num_replicas=3, blocks_per_replica=64, load_poll_s=0.5), ["llmd"],
                              show_progress=False, with_ceilings=False)
    assert "load_poll_s" not in polled["policies"]["llmd"]  # a poll given is kept
    assert report["config"]["load_poll_s"] == 0.0
