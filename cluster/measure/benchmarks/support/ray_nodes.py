"""Several Ray nodes on this machine standing in for hosts, and ``kvmesh serve`` on them with placed routers.

``ray.cluster_utils.Cluster`` starts a head and worker raylets, each with its own CPUs and a custom resource
(``ROUTER_RESOURCE``) that serve's routers are placed by; ``kvmesh serve --address`` joins it as a process of
its own. The routers share no memory: each is a Ray actor in a worker process of its node. What they share is the
database of stored responses and tenants' totals: PostgreSQL when given a DSN, else the SQLite files of the state
directory each router resolves in its own environment, which a Ray worker takes from its node's raylet: every
node is started with the same ``KVMESH_STATE_DIR`` (this machine's one directory, as the hosts' one database).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvmesh.cluster.launch.embedded_model import CHAT_TEMPLATE
from kvmesh.replica.openai.responses_api.store_config import STATE_DIR_ENV

ROUTER_RESOURCE = "kvmesh_router"
"""The custom resource every stand-in node offers routers."""
SERVED_NAME = "stories260K"
"""The model name clients send."""
NAMESPACE = "kvmesh-multi-router"
"""The Ray namespace of serve's named actors in this benchmark."""


class LocalNodes:
    """A head and ``num_nodes - 1`` worker raylets on this machine (``ray.cluster_utils.Cluster``)."""

    def __init__(self, num_nodes: int, cpus_per_node: int, routers_per_node: int, state_dir: Path) -> None:
        from ray.cluster_utils import Cluster

        node = {"num_cpus": cpus_per_node, "resources": {ROUTER_RESOURCE: routers_per_node},
                "include_dashboard": False, "env_vars": {STATE_DIR_ENV: str(state_dir)}}
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(node))
        for _ in range(num_nodes - 1):
            self.cluster.add_node(**node)
        self.cluster.wait_for_nodes()
        self.num_nodes = num_nodes

    @property
    def address(self) -> str:
        return self.cluster.address

    def shutdown(self) -> None:
        self.cluster.shutdown()


@dataclass(frozen=True, slots=True)
class ServeShape:
    """What one ``kvmesh serve`` on the nodes runs."""

    model: str
    replicas: int
    routers: int
    ready_timeout_s: float
    router: dict
    """Settings of the router section besides its address and model name (keys, stored responses)."""
    state_dir: Path
    """The nodes' state directory (serve's control router takes it too)."""
    namespace: str = NAMESPACE
    """The Ray namespace of its named actors (one per serve started on the same nodes)."""


class PlacedServe:
    """``kvmesh serve`` joined to the nodes, its routers placed on them; ``router(i)`` finds each through Ray."""

    def __init__(self, address: str, shape: ServeShape, work: Path) -> None:
        timeout_s = shape.ready_timeout_s
        config = {"ray": {"address": address, "namespace": shape.namespace, "ready_timeout_s": timeout_s},
                  "engine": {"model": shape.model, "device": "cpu", "max_model_len": 512},
                  "replicas": {"num_replicas": shape.replicas, "num_cpus_per_worker": 1, "http_port": 0,
                               "event_port": 0},
                  "router": {"host": "127.0.0.1", "port": 0, "served_model_name": SERVED_NAME, **shape.router},
                  "frontend": {"chat_template": CHAT_TEMPLATE},  # stories260K ships none
                  "routers": {"num_routers": shape.routers, "router_resource": ROUTER_RESOURCE, "router_cpus": 0,
                              "router_ready_timeout_s": timeout_s}}  # this machine stands in for every host
        (work / "serve.json").write_text(json.dumps(config))  # YAML is a superset of JSON
        self.log_path = work / "serve.log"
        self.num_routers, self.namespace = shape.routers, shape.namespace
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVMESH_API_KEY", "KVMESH_ADMIN_KEY"))}
        env["KVMESH_CLUSTERS_DIR"] = str(work / "clusters")
        env[STATE_DIR_ENV] = str(shape.state_dir)
        self.records = work / "clusters"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--config",
                                          str(work / "serve.json")], stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while "kvmesh is ready" not in self.log_tail(50_000):
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvmesh serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvmesh serve was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    @property
    def admin_key(self) -> str:
        record = next(self.records.glob("*.json"))
        return json.loads(record.read_text())["admin_key"]

    def router(self, index: int):
        import ray

        return ray.get_actor(f"kvmesh-router-{index}", namespace=self.namespace)

    def router_node(self, index: int, timeout_s: float = 30.0) -> str:
        """The Ray node id router ``index`` runs on."""
        import ray

        return ray.get(self.router(index).node_id.remote(), timeout=timeout_s)

    def router_urls(self, timeout_s: float = 30.0) -> list[str]:
        import ray

        return ray.get([self.router(i).url.remote() for i in range(self.num_routers)], timeout=timeout_s)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # Ctrl-C: serve stops its routers, replicas and board
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def started_serve(address: str, shape: ServeShape, work: Path) -> PlacedServe:
    """``kvmesh serve`` ready on the nodes; started once more when its first start fails (a loaded machine can miss
    a start-up deadline, as Ray's own raylet registration can), the first failure printed."""
    for attempt in (1, 2):
        (work / f"start-{attempt}").mkdir(parents=True)
        serve = PlacedServe(address, shape, work / f"start-{attempt}")
        try:
            serve.wait_ready(shape.ready_timeout_s)
            return serve
        except RuntimeError as e:
            serve.stop()
            if attempt == 2:
                raise
            print(f"kvmesh bench multi-router: serve did not start; starting it once more:\n{e}", file=sys.stderr)
    raise AssertionError("unreachable")
