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
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Where one replica's workers go."""

    replica_index: int
    """0-based replica number."""
    placement_group: Any
    """The replica's ray.util.placement_group.PlacementGroup (one bundle per TP rank)."""
    target_node_id: str | None
    """The node the plan asked for (a soft hint; None = Ray chooses)."""


def replica_bundles(tensor_parallel_size: int, num_cpus_per_worker: float, device: str) -> list[dict[str, float]]:
    """Bundles of one replica's placement group.

    TP=1: one bundle; the replica actor itself runs the model.
    TP>1: bundles 0..tp-1 for the TP worker ranks (replica/tp_worker.py uses bundle i for rank i),
    then one CPU bundle for the replica actor (scheduler + HTTP) on the same node.
    """
    worker = {"CPU": float(num_cpus_per_worker)}
    if device == "cuda":
        worker["GPU"] = 1.0
    bundles = [dict(worker) for _ in range(tensor_parallel_size)]
    if tensor_parallel_size > 1:
        bundles.append({"CPU": 1.0})
    return bundles


def actor_bundle_index(tensor_parallel_size: int) -> int:
    """Which bundle the replica actor sits in (see ``replica_bundles``)."""
    return 0 if tensor_parallel_size == 1 else tensor_parallel_size


def plan_nodes(nodes: list[dict[str, Any]], bundles: list[dict[str, float]], num_replicas: int,
               placement: str) -> list[str | None]:
    """Target node id per replica: round-robin over nodes with room for a whole replica.

    ``nodes`` are ``ray.nodes()`` entries. Capacity is what each node offers in total, minus what
    earlier replicas of this plan took; a replica no node can hold gets None (Ray decides, and
    the wait below reports it if nothing fits).
    """
    if placement == "pack":
        return [None] * num_replicas
    need: dict[str, float] = {}
    for bundle in bundles:
        for key, amount in bundle.items():
            need[key] = need.get(key, 0.0) + amount
    free = {n["NodeID"]: dict(n.get("Resources", {})) for n in sorted(nodes, key=lambda n: n["NodeID"])
            if n.get("Alive")}
    order = list(free)
    targets: list[str | None] = []
    cursor = 0
    for _ in range(num_replicas):
        chosen = None
        for step in range(len(order)):
            node_id = order[(cursor + step) % len(order)]
            if all(free[node_id].get(k, 0.0) >= v for k, v in need.items()):
                chosen = node_id
                cursor = (cursor + step + 1) % len(order)
                break
        if chosen is not None:
            for key, amount in need.items():
                free[chosen][key] -= amount
        targets.append(chosen)
    return targets


def create_placement_groups(num_replicas: int, bundles: list[dict[str, float]], placement: str,
                            name_prefix: str = "kvmesh-replica") -> list[ReplicaPlacement]:
    """Ask Ray for one STRICT_PACK group per replica (returns at once; see ``wait_ready``)."""
    import ray
    from ray.util.placement_group import placement_group

    targets = plan_nodes(ray.nodes(), bundles, num_replicas, placement)
    groups = []
    for index, target in enumerate(targets):
        pg = placement_group(bundles, strategy="STRICT_PACK", name=f"{name_prefix}-{index}",
                             _soft_target_node_id=target)
        groups.append(ReplicaPlacement(replica_index=index, placement_group=pg, target_node_id=target))
    return groups


def wait_ready(groups: list[ReplicaPlacement], timeout_s: float) -> None:
    """Block until every group is placed; on timeout say what could not be placed and why."""
    import ray

    deadline = time.monotonic() + timeout_s
    pending = {g.replica_index: g for g in groups}
    while pending:
        refs = {g.placement_group.ready(): i for i, g in pending.items()}
        remaining = max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=min(remaining, 1.0))
        for ref in ready:
            pending.pop(refs[ref], None)
        if pending and time.monotonic() >= deadline:
            bundles = next(iter(pending.values())).placement_group.bundle_specs
            raise TimeoutError(
                f"replicas {sorted(pending)} could not be placed within {timeout_s:.0f}s: each needs "
                f"{bundles} on ONE node, the cluster offers {ray.available_resources()}. Add nodes (or GPUs), "
                "lower --num-replicas / --tensor-parallel-size, or raise --num-cpus for an embedded cluster.")


def remove_placement_groups(groups: list[ReplicaPlacement]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        try:
            remove_placement_group(group.placement_group)
        except Exception as e:  # already gone with its owner: nothing to clean
            logger.debug("placement group of replica %d: %s", group.replica_index, e)
