"""Can the cluster hold the replicas? Decided from data, before any placement group is created.

    replica (one STRICT_PACK placement group)        node (Ray's resources)
    ┌────────────────────────────────────────┐       ┌───────────────────────────────┐
    │ bundle per TP rank {CPU: c, GPU: g}    │  fits │ CPU: 16                       │
    │ (+ {CPU: 1} for the actor when TP > 1) │ ────▶ │ GPU instances: [1.0, 1.0] ... │
    └────────────────────────────────────────┘       └───────────────────────────────┘

Ray's resource model, which this follows: a placement group's bundles are reserved from a node's
resources; GPUs are unit-instance resources, so a fractional request (``g < 1``) is carved out of
ONE card (three 0.33 bundles share a card, two 0.6 bundles do not) and whole GPUs are whole
untouched cards; amounts are counted in steps of 0.0001. All replicas are alike, so how
many a node holds does not depend on the others: the cluster holds the sum over its nodes.

``check_capacity`` raises ``CapacityError`` with a message that says what the replicas need, what
each node has, and what to change. It is pure (nodes come in as ``NodeResources``), so it is
tested without Ray; ``placement.cluster_nodes`` reads them from Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmesh.cluster.config.gpu_share import RESOURCE_STEP

UNBOUNDED = 1 << 30
"""Replicas a node holds when a replica needs none of its resources."""


class CapacityError(ValueError):
    """The cluster cannot hold the replicas; the message says what is needed, what is there, what to do."""

    def __init__(self, shortfall: str, advice: str) -> None:
        super().__init__(f"{shortfall}. {advice}")
        self.shortfall = shortfall
        """What the replicas need and what the nodes hold (the message without the advice)."""


@dataclass(frozen=True, slots=True)
class NodeResources:
    """One alive Ray node's resources, as ``ray.nodes()`` reports them."""

    node_id: str
    """Ray's node id (hex)."""
    address: str
    """The node's IP (``NodeManagerAddress``), for messages."""
    resources: dict[str, float] = field(default_factory=dict)
    """Ray resources of the node: ``{"CPU": 16.0, "GPU": 2.0, ...}``."""

    @property
    def cpus(self) -> float:
        return self.resources.get("CPU", 0.0)

    @property
    def gpus(self) -> float:
        return self.resources.get("GPU", 0.0)

    def describe(self) -> str:
        return f"node {self.address}: {_count(self.gpus, 'GPU')}, {_count(self.cpus, 'CPU')}"


def _units(amount: float) -> int:
    """``amount`` in Ray's fixed-point steps (0.0001)."""
    return round(amount / RESOURCE_STEP)


def _count(amount: float, unit: str) -> str:
    text = f"{amount:g}"
    return f"{text} {unit}" + ("" if amount == 1 else "s")


def _gpu_instances(gpus: float) -> list[int]:
    """A node's GPUs as Ray's unit instances, in steps: 2.0 -> [10000, 10000]; a fraction is a partial card."""
    whole = int(gpus + RESOURCE_STEP / 2)
    rest = _units(gpus) - whole * _units(1.0)
    return [_units(1.0)] * whole + ([rest] if rest > 0 else [])


class NodeRoom:
    """A node's resources left, in Ray's steps; replicas are taken out of it one at a time."""

    def __init__(self, node: NodeResources) -> None:
        self.node = node
        self.free = {key: _units(value) for key, value in node.resources.items() if key != "GPU"}
        self.cards = _gpu_instances(node.gpus)

    def take(self, bundles: list[dict[str, float]]) -> bool:
        """Reserve one replica's bundles here when they all fit (nothing is taken otherwise)."""
        free, cards = dict(self.free), list(self.cards)
        for bundle in bundles:
            for key, amount in bundle.items():
                if key == "GPU":
                    if not _take_gpu(cards, _units(amount)):
                        return False
                    continue
                free[key] = free.get(key, 0) - _units(amount)
                if free[key] < 0:
                    return False
        self.free, self.cards = free, cards
        return True


def replicas_on_node(node: NodeResources, bundles: list[dict[str, float]]) -> int:
    """How many replicas of ``bundles`` (all on this node, STRICT_PACK) the node holds."""
    if not any(_units(amount) for bundle in bundles for amount in bundle.values()):
        return UNBOUNDED  # a replica that needs nothing
    room, count = NodeRoom(node), 0
    while room.take(bundles):
        count += 1
    return count


def _take_gpu(cards: list[int], need: int) -> bool:
    """Reserve ``need`` steps of GPU from ``cards`` as Ray does: whole GPUs from untouched cards, a fraction
    from one card (the fullest that still fits, so fractions pack)."""
    one = _units(1.0)
    whole, part = divmod(need, one)
    untouched = [i for i, free in enumerate(cards) if free == one]
    if len(untouched) < whole:
        return False
    for i in untouched[:whole]:
        cards[i] = 0
    if part:
        fitting = [i for i, free in enumerate(cards) if free >= part]
        if not fitting:
            return False
        cards[min(fitting, key=lambda j: cards[j])] -= part
    return True


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """How many replicas each node holds (by node id), and whether that covers the request."""

    per_node: dict[str, int]
    """Replicas each node holds at most, alone."""
    num_replicas: int
    """Replicas asked for."""

    @property
    def holds(self) -> int:
        return sum(self.per_node.values())

    @property
    def fits(self) -> bool:
        return self.holds >= self.num_replicas


def plan_capacity(nodes: list[NodeResources], bundles: list[dict[str, float]], num_replicas: int) -> CapacityPlan:
    return CapacityPlan({n.node_id: replicas_on_node(n, bundles) for n in nodes}, num_replicas)


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    """What one replica asks for (the words the error message uses)."""

    tensor_parallel_size: int
    """Workers per replica, all on one node."""
    gpus_per_worker: float
    """GPUs each worker holds (0 on CPU)."""
    bundles: list[dict[str, float]]
    """The replica's placement-group bundles (``placement.replica_bundles``)."""

    @property
    def gpus(self) -> float:
        return self.tensor_parallel_size * self.gpus_per_worker

    @property
    def cpus(self) -> float:
        return sum(b.get("CPU", 0.0) for b in self.bundles)


def check_capacity(nodes: list[NodeResources], shape: ReplicaShape, num_replicas: int,
                   embedded: bool = False) -> CapacityPlan:
    """The plan when the nodes hold ``num_replicas`` replicas; else ``CapacityError`` saying what to do.

    ``embedded``: the cluster is serve's own local Ray (more CPUs come from ``--num-cpus``, not nodes)."""
    plan = plan_capacity(nodes, shape.bundles, num_replicas)
    if plan.fits:
        return plan
    raise CapacityError(_shortfall(nodes, shape, plan), _advice(nodes, shape, plan, embedded))


def _shortfall(nodes: list[NodeResources], shape: ReplicaShape, plan: CapacityPlan) -> str:
    n, tp = plan.num_replicas, shape.tensor_parallel_size
    there = "; ".join(f"{node.describe()} -> holds {plan.per_node[node.node_id]}" for node in nodes) or "no alive node"
    total_gpus = sum(node.gpus for node in nodes)
    if shape.gpus:
        need = (f"{_count(n, 'replica')} x {_count(shape.gpus, 'GPU')}"
                + (f" ({tp} workers on ONE node: tensor parallelism all-reduces every layer)" if tp > 1 else "")
                + f" need {_count(n * shape.gpus, 'GPU')} and {_count(n * shape.cpus, 'CPU')}")
        have = f"the cluster has {_count(total_gpus, 'GPU')} and holds {_count(plan.holds, 'replica')} ({there})"
    else:
        need = f"{_count(n, 'replica')} x {_count(shape.cpus, 'CPU')} need {_count(n * shape.cpus, 'CPU')}"
        have = f"the cluster holds {_count(plan.holds, 'replica')} ({there})"
    return f"{need}; {have}"


def _advice(nodes: list[NodeResources], shape: ReplicaShape, plan: CapacityPlan, embedded: bool) -> str:
    n, tp = plan.num_replicas, shape.tensor_parallel_size
    options = []
    if shape.gpus and not any(node.gpus for node in nodes):
        options.append("--device cpu")
    if plan.holds:
        options.append(f"--num-replicas {plan.holds}")
    if shape.gpus and tp > 1 and not any(node.gpus >= shape.gpus for node in nodes):
        most = max((node.gpus for node in nodes), default=0.0)
        options.append(f"--tensor-parallel-size {max(1, int(most))} (no node has {_count(shape.gpus, 'GPU')}; "
                       f"the most on one node is {most:g})")
    if shape.gpus and tp == 1:
        share = _fitting_share(nodes, shape, n)
        if share is not None and share < shape.gpus_per_worker:
            options.append(f"--gpus-per-replica {share:g} ({round(1 / share)} replicas per GPU)")
    cpu_bound = plan_capacity(nodes, [{k: v for k, v in b.items() if k != "CPU"} for b in shape.bundles], n).fits
    if cpu_bound:
        options.append("a higher --num-cpus (serve starts this Ray itself; logical CPUs may exceed cores)" if embedded
                       else "a lower --num-cpus-per-worker")
    if embedded:
        options.append(f"join a Ray cluster that has {'the GPUs' if shape.gpus else 'them'} (--address)")
    else:
        more = f"nodes with {shape.gpus:g}+ GPUs" if tp > 1 and shape.gpus else "GPU nodes" if shape.gpus else "nodes"
        options.append(f"add {more} (when a Ray autoscaler adds them on demand, pass --wait-for-nodes)")
    if len(options) == 1:
        return options[0][0].upper() + options[0][1:] + "."
    return "Use " + ", ".join(options[:-1]) + f", or {options[-1]}."


def _fitting_share(nodes: list[NodeResources], shape: ReplicaShape, num_replicas: int) -> float | None:
    """The largest 1/k of a GPU (k replicas per card, shown to 2 decimals) at which the replicas fit."""
    cards = sum(len(_gpu_instances(node.gpus)) for node in nodes)
    if not cards:
        return None
    for k in range(max(2, math.ceil(num_replicas / cards)), 17):
        share = math.floor(100 / k) / 100
        bundles = [{**b, "GPU": share} if "GPU" in b else b for b in shape.bundles]
        if plan_capacity(nodes, bundles, num_replicas).fits:
            return share
    return None
