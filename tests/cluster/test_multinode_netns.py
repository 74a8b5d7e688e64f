"""Multi-node for real: a Ray head and a Ray worker node in two network namespaces on this machine,
one replica placed on each, a request routed across the veth link; everything cleaned up after."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ray, pytest.mark.slow]
DRIVER = Path(__file__).with_name("netns_driver.py")


def _load_helper():
    """tests/cluster/netns_cluster.py (pytest's importlib mode puts no test folder on sys.path)."""
    spec = importlib.util.spec_from_file_location("kvmesh_netns_cluster", Path(__file__).with_name("netns_cluster.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


netns = _load_helper()


@pytest.fixture(scope="module")
def two_nodes():
    reason = netns.netns_unavailable_reason()
    if reason:
        pytest.skip(f"multi-node netns test: {reason}")
    with netns.TwoNodeCluster(cpus_per_node=2) as cluster:
        yield cluster
    assert not cluster.leftover_pids()


def test_one_replica_per_node_serves_through_the_router(two_nodes, tmp_path):
    env = {"KVMESH_CACHE_DIR": str(tmp_path / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
    run = two_nodes.run_in_head([sys.executable, str(DRIVER), two_nodes.address], timeout_s=400, env=env)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"driver printed no result (rc={run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert "error" not in result, result
    assert len(set(result["replica_nodes"])) == 2, "both replicas landed on one node"
    hosts = {url.split("//")[1].split(":")[0] for url in result["replica_urls"]}
    assert hosts == {two_nodes.head_ip, two_nodes.worker_ip}  # each binds its node's private IP
    assert result["router_url"].startswith(f"http://{two_nodes.head_ip}:")  # the node IP, not 0.0.0.0
    assert result["status"] == 200 and result["completion_tokens"] == 8
    assert len(result["healthy"]) == 2
