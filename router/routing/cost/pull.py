"""A peer pull's price in seconds: bytes over the pulling replica's measured pull rate plus its measured fixed cost.

Until a replica measured its pulls it is priced with the slowest rate and largest fixed cost another candidate
measured (fleet.py), and before any did, with the router's priors (``PullPriors``: from ``KVPlacementRules``'
``peer_pull_assumed_bytes_per_s`` and ``peer_pull_overhead_s``, kept in fleet.py with the other priors).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.cost.fleet import FleetRates, PullPriors
from kvmesh.router.routing.cost.measured import measured
from kvmesh.router.routing.cost.ops import SCALAR
from kvmesh.router.routing.cost.terms import pull_cost_s


def pull_holder(loads: Mapping[ReplicaId, ReplicaLoad], matches: Mapping[ReplicaId, int], usable: int,
                priors: PullPriors | None) -> tuple[ReplicaId | None, int]:
    """(the candidate others may pull from: the one with KV transfer on holding the most leading blocks of
    ``matches``, the blocks it holds, at most ``usable``); (None, 0) when pulls are off or none holds any."""
    if priors is None or not priors.enabled:
        return None, 0
    holder, best = None, 0
    for rid, m in matches.items():
        if m > best and rid in loads and loads[rid].kv_transfer_enabled:
            holder, best = rid, m
    return holder, min(best, usable)


def can_pull(chosen: ReplicaLoad, holder: ReplicaLoad, priors: PullPriors | None) -> bool:
    """Both replicas report KV transfer on with the same KV layout (router/replicas/kv_share.py) and the router plans
    pulls."""
    return priors is not None and priors.enabled and chosen.kv_transfer_enabled and holder.kv_transfer_enabled \
        and chosen.kv_layout == holder.kv_layout


def pull_seconds(chosen: ReplicaLoad, fleet: FleetRates, num_blocks: int, block_size: int,
                 priors: PullPriors) -> float | None:
    """Seconds for ``chosen`` to pull ``num_blocks`` (0 for none); None when it cannot be priced (terms.py)."""
    if num_blocks <= 0:
        return 0.0
    seconds = pull_cost_s(measured(chosen), fleet, priors, num_blocks, block_size, SCALAR)
    return seconds if seconds == seconds else None
