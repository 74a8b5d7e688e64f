"""One Ray placement group per replica: its tensor-parallel workers together, replicas spread out.

    node A                          node B
    ┌──────────────────────────┐    ┌──────────────────────────┐
    │ pg replica-0 STRICT_PACK │    │ pg replica-1 STRICT_PACK │
    │  bundle 0: rank 0 {GPU:1}│    │  bundle 0: rank 0 {GPU:1}│
    │  bundle 1: rank 1 {GPU:1}│    │  bundle 1: rank 1 {GPU:1}│
    └──────────────────────────┘    └──────────────────────────┘

Within a replica, ``STRICT_PACK`` keeps all ranks on one node (tensor parallelism all-reduces
every layer). Across replicas, Ray has no "spread these groups" strategy, so ``placement: spread``
plans a round-robin over the nodes that can hold a whole replica and gives each group that node
as a soft target (``_soft_target_node_id``): spread when there is room, packed when not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from kvmesh.cluster.launch import capacity
from kvmesh.cluster.launch.capacity import CapacityPlan, NodeResources, ReplicaShape, replicas_on_node

if TYPE_CHECKING:
    from kvmesh.cluster.config.trees import ServeConfig
    from ray.util.placement_group import PlacementGroup

logger = logging.getLogger(__name__)


class RayNode(TypedDict, total=False):
    """One ``ray.nodes()`` entry, the fields read here."""

    NodeID: str
    """Ray's node id."""
    NodeManagerAddress: str
    """The node's address."""
    Resources: dict[str, float]
    """The node's total resources (``CPU``, ``GPU``, ...)."""
    Alive: bool
    """False for a node that left."""


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Where one replica's workers go."""

    replica_index: int
    """0-based replica number."""
    placement_group: PlacementGroup
    """The replica's ray.util.placement_group.PlacementGroup (one bundle per TP rank)."""
    target_node_id: str | None
    """The node the plan asked for (a soft hint; None = Ray chooses)."""


def replica_bundles(tensor_parallel_size: int, num_cpus_per_worker: float, device: str,
                    gpus_per_worker: float = 1.0) -> list[dict[str, float]]:
    """Bundles of one replica's placement group.

    TP=1: one bundle; the replica actor itself runs the model (``gpus_per_worker`` may be a fraction:
    several replicas share a card). TP>1: bundles 0..tp-1 for the TP worker ranks (replica/worker/tp_worker.py
    uses bundle i for rank i), then one CPU bundle for the replica actor (scheduler + HTTP) on the same node.
    """
    worker = {"CPU": float(num_cpus_per_worker)}
    if device == "cuda":
        worker["GPU"] = float(gpus_per_worker)
    bundles = [dict(worker) for _ in range(tensor_parallel_size)]
    if tensor_parallel_size > 1:
        bundles.append({"CPU": 1.0})
    return bundles


def actor_bundle_index(tensor_parallel_size: int) -> int:
    """Which bundle the replica actor sits in (see ``replica_bundles``)."""
    return 0 if tensor_parallel_size == 1 else tensor_parallel_size


def nodes_from_ray_nodes(nodes: list[RayNode]) -> list[NodeResources]:
    """``ray.nodes()`` entries -> the alive nodes' total resources, ordered by node id."""
    return [NodeResources(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
            for n in sorted(nodes, key=lambda n: n["NodeID"]) if n.get("Alive")]


def cluster_nodes() -> list[NodeResources]:
    """The connected Ray cluster's alive nodes with their total resources."""
    import ray

    return nodes_from_ray_nodes(ray.nodes())


def embedded_nodes(num_cpus: int) -> list[NodeResources]:
    """The one node an embedded Ray will have, before it starts: ``num_cpus`` logical CPUs and the GPUs
    Ray's own detection finds here (what ``ray.init`` without ``num_gpus`` registers)."""
    from ray._private import accelerators

    manager = accelerators.get_accelerator_manager_for_resource("GPU")
    gpus = manager.get_current_node_num_accelerators()
    visible = manager.get_current_process_visible_accelerator_ids()
    if visible is not None:
        gpus = min(gpus, len(visible))
    return [NodeResources("embedded", "127.0.0.1", {"CPU": float(num_cpus), "GPU": float(gpus)})]


def check_capacity(bundles: list[dict[str, float]], tensor_parallel_size: int, gpus_per_worker: float,
                   num_replicas: int, embedded: bool, nodes: list[NodeResources] | None = None) -> CapacityPlan:
    """``capacity.check_capacity`` against ``nodes`` (default: the connected Ray cluster's); ``CapacityError``."""
    gpus = gpus_per_worker if any("GPU" in b for b in bundles) else 0.0
    return capacity.check_capacity(cluster_nodes() if nodes is None else nodes,
                                   ReplicaShape(tensor_parallel_size, gpus, bundles), num_replicas, embedded=embedded)


def check_serve_capacity(config: ServeConfig, bundles: list[dict[str, float]], num_replicas: int, embedded: bool,
                         report: Callable[[str], None]) -> None:
    """``check_capacity`` for serve's ``config``; with ``ray.wait_for_nodes`` a shortfall is only reported
    (a Ray autoscaler may add the nodes) and ``wait_ready`` waits up to ``ray.placement_timeout_s``."""
    try:
        check_capacity(bundles, config.engine.tensor_parallel_size, config.gpus_per_worker, num_replicas, embedded)
    except capacity.CapacityError as e:
        if not config.ray.wait_for_nodes:
            raise
        report(f"the nodes cannot hold the replicas yet: {e.shortfall}; waiting up to "
               f"{config.ray.placement_timeout_s:g}s for the Ray autoscaler to add nodes")


def plan_nodes(nodes: list[RayNode], bundles: list[dict[str, float]], num_replicas: int,
               placement: str) -> list[str | None]:
    """Target node id per replica: round-robin over nodes with room for a whole replica.

    ``nodes`` are ``ray.nodes()`` entries. A node takes as many replicas as its total resources hold
    (Ray's resource model, ``capacity.replicas_on_node``); a replica no node can hold gets None (Ray
    decides, and ``wait_ready`` reports it if nothing fits).
    """
    if placement == "pack":
        return [None] * num_replicas
    room = {node.node_id: replicas_on_node(node, bundles) for node in nodes_from_ray_nodes(nodes)}
    order = list(room)
    targets: list[str | None] = []
    cursor = 0
    for _ in range(num_replicas):
        chosen = None
        for step in range(len(order)):
            node_id = order[(cursor + step) % len(order)]
            if room[node_id] > 0:
                chosen = node_id
                room[node_id] -= 1
                cursor = (cursor + step + 1) % len(order)
                break
        targets.append(chosen)
    return targets


def create_placement_groups(num_replicas: int, bundles: list[dict[str, float]], placement: str,
                            name_prefix: str = "kvmesh-replica") -> list[ReplicaPlacement]:
    """Ask Ray for one STRICT_PACK group per replica (returns at once; see ``wait_ready``), named
    ``{name_prefix}-{index}-{this call's token}``: Ray refuses a second group of a name, and another cluster (a
    second serve joining the same Ray, an in-process test cluster) may have placed ``{name_prefix}-0`` already."""
    import secrets

    import ray
    from ray.util.placement_group import placement_group

    targets = plan_nodes(ray.nodes(), bundles, num_replicas, placement)
    groups, token = [], secrets.token_hex(3)
    for index, target in enumerate(targets):
        pg = placement_group(bundles, strategy="STRICT_PACK", name=f"{name_prefix}-{index}-{token}",
                             _soft_target_node_id=target)
        groups.append(ReplicaPlacement(replica_index=index, placement_group=pg, target_node_id=target))
    return groups


def wait_ready(groups: list[ReplicaPlacement], timeout_s: float, report: Callable[[str], None] | None = None,
               note_every_s: float = 10.0, first_note_s: float = 2.0) -> None:
    """Block until every group is placed, saying after ``first_note_s`` and then every ``note_every_s`` what
    is still waiting (placing takes well under a second when there is room: a wait means other work holds
    the resources, or nodes are being added); after ``timeout_s`` raise ``TimeoutError`` naming what could
    not be placed and what the cluster has free."""
    import ray

    started = time.monotonic()
    deadline, last_note = started + timeout_s, started - note_every_s + min(first_note_s, note_every_s)
    pending = {g.replica_index: g for g in groups}
    while pending:
        refs = {g.placement_group.ready(): i for i, g in pending.items()}
        remaining = max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=min(remaining, 1.0))
        for ref in ready:
            pending.pop(refs[ref], None)
        now = time.monotonic()
        if pending and now >= deadline:
            bundles = next(iter(pending.values())).placement_group.bundle_specs
            raise TimeoutError(
                f"replicas {sorted(pending)} could not be placed within {timeout_s:g}s (ray.placement_timeout_s): "
                f"each needs {bundles} on ONE node, the cluster has free {_free_summary()}. Free what other work "
                "holds, add nodes (or GPUs), lower --num-replicas / --tensor-parallel-size, or wait longer "
                "(--placement-timeout-s).")
        if pending and report is not None and now - last_note >= note_every_s:
            last_note = now
            report(f"waiting for Ray to place {len(pending)} of {len(groups)} replica(s) [{now - started:.0f}s of "
                   f"{timeout_s:g}s]; free now: {_free_summary()}")


def _free_summary() -> str:
    """What each node has free now (Ray's view), for messages."""
    import ray

    try:  # per node: Ray's DeveloperAPI; the cluster's sum where it is missing
        from ray._private.state import available_resources_per_node

        per_node = available_resources_per_node()
    except Exception:  # a message helper must not hide the error it explains
        per_node = {"cluster": ray.available_resources()}
    names = {n.node_id: n.address for n in cluster_nodes()}
    rows = []
    for node_id, free in sorted(per_node.items()):
        shown = {k: round(v, 4) for k, v in sorted(free.items()) if k in ("CPU", "GPU")}
        rows.append(f"{names.get(node_id, node_id[:8])} {shown}")
    return "; ".join(rows) or "nothing"


def remove_placement_groups(groups: list[ReplicaPlacement]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        try:
            remove_placement_group(group.placement_group)
        except Exception as e:  # already gone with its owner: nothing to clean
            logger.debug("placement group of replica %d: %s", group.replica_index, e)
