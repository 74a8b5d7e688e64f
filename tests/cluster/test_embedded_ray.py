"""``kvmesh serve`` without ``ray.address`` starts a Ray instance of its own, as its config says, whatever Ray the
machine already knows of: an exported ``RAY_ADDRESS``, or a ``ray start`` cluster. Joining one is ``--address``'s
job; an embedded serve that joined another's cluster would collide with its named replicas and take it for its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONNECT = textwrap.dedent("""
    import ray
    from kvmesh.cluster.config.trees import ServeConfig
    from kvmesh.cluster.launch.ray_cluster import connect
    handle = connect(ServeConfig())
    print("owned" if handle.owned else "joined", ray.get_runtime_context().gcs_address)
    ray.shutdown()
""")


def test_an_embedded_start_ignores_a_ray_address_in_the_environment():
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}  # nothing listens there: joining it would fail
    result = subprocess.run([sys.executable, "-c", CONNECT], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    owned, gcs = result.stdout.split()[-2:]
    assert owned == "owned" and not gcs.endswith(":9"), result.stdout
