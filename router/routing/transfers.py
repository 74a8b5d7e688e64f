"""When KV moves between replicas (issue 32): the prefill/decode split and peer pulls, decided without I/O.

**Split.** The decode replica is chosen first (the policy, as for any request). The prompt goes to a prefill
replica first only when its uncached suffix on that decode replica is at least ``pd_min_uncached_tokens`` and
a prefill replica has room (``choose_prefill``: the least loaded healthy prefill replica whose prefill backlog
is under ``pd_max_prefill_backlog_tokens``). A short suffix stays whole: a split adds a round trip and a
transfer to the time to first token, and pays only when the prompt would stall the decode batch.

**Peer pull.** When the policy sends a request away from the replica holding the most of its prefix (load),
the chosen replica can pull the holder's extra blocks instead of computing them (``price_pull``)::

    pull_s      = extra blocks * bytes per block / chosen's pull_bytes_per_s + pull_overhead_s
    recompute_s = extra blocks * block_size / chosen's prefill_tokens_per_s

priced with ``ReplicaLoad.pull_s`` (the host tier's load-back form, ``load.copy_seconds``). A pull is planned
only when ``pull_s < recompute_s`` and both replicas report ``kv_transfer.enabled`` in ``/load``. A replica
that has not measured a pull yet is priced at ``assumed_pull_bytes_per_s``; one without a prefill rate at the
mean of those reported (none anywhere: no pull, it cannot be priced).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from kvmesh.router.routing.load import ReplicaLoad

SPLIT_OK, SPLIT_PREFILL_FAILED, SPLIT_NO_ROOM = "ok", "prefill_failed", "skipped_no_room"
SPLIT_OUTCOMES = (SPLIT_OK, SPLIT_PREFILL_FAILED, SPLIT_NO_ROOM)
"""``kvmesh_router_pd_splits_total{outcome}``: split done, prefill call failed (the decode replica computed the
prompt), split wanted but no prefill replica had room."""


@dataclass(frozen=True, slots=True)
class TransferRules:
    """The router's settings for moving KV (``RouterConfig``'s ``pd_*`` and ``peer_pull*`` fields)."""

    pd_min_uncached_tokens: int = 256
    """Uncached prompt tokens on the decode replica from which a prompt is prefilled on a prefill replica."""
    pd_max_prefill_backlog_tokens: int = 16384
    """A prefill replica has room while its prefill backlog (tokens) is below this."""
    peer_pulls: bool = True
    """Plan peer pulls at all."""
    pull_overhead_s: float = 0.01
    """Fixed seconds one pull costs besides the copy (lease, handshake, release round trips)."""
    assumed_pull_bytes_per_s: float = 1e9
    """Pull bandwidth assumed for a replica that has measured none yet; 0: no pull until measured."""


@dataclass(frozen=True, slots=True)
class PlannedPull:
    """A peer pull the router asks the chosen replica to make (``kv_transfer_params.remote_url`` = the holder's)."""

    holder_id: Hashable
    """The replica holding the prefix."""
    num_tokens: int
    """Prompt tokens the pull should move (the holder's extra full blocks)."""
    pull_s: float
    """Its price in seconds."""
    recompute_s: float
    """What computing them instead would cost in seconds."""


def choose_prefill(loads: Mapping[Hashable, ReplicaLoad], prefill_ids: set, healthy: set,
                   rules: TransferRules) -> Hashable | None:
    """The least loaded healthy prefill replica with room (backlog, then requests in flight); None: none has room."""
    best, best_key = None, None
    for rid in prefill_ids:
        load = loads.get(rid)
        if load is None or rid not in healthy or load.prefill_backlog >= rules.pd_max_prefill_backlog_tokens:
            continue
        key = (load.prefill_backlog, load.total_in_flight)
        if best_key is None or key < best_key:
            best, best_key = rid, key
    return best


def price_pull(chosen: ReplicaLoad, holder: ReplicaLoad, extra_blocks: int, block_size: int,
               mean_prefill_rate: float | None, rules: TransferRules) -> tuple[float, float] | None:
    """(pull_s, recompute_s) of moving ``extra_blocks`` from ``holder`` to ``chosen``; None when no pull is
    possible (transfer off on either end, peer pulls off) or it cannot be priced."""
    if not (rules.peer_pulls and extra_blocks > 0 and chosen.kv_transfer_enabled and holder.kv_transfer_enabled):
        return None
    rate = chosen.prefill_tokens_per_s or mean_prefill_rate
    pull_s = chosen.pull_s(extra_blocks, block_size, rules.pull_overhead_s, rules.assumed_pull_bytes_per_s or None)
    if not rate or pull_s is None:
        return None
    return pull_s, extra_blocks * block_size / rate


def plan_pull(chosen_id: Hashable, chosen_blocks: int, device_matches: Mapping[Hashable, int],
              loads: Mapping[Hashable, ReplicaLoad], candidates: set, usable_blocks: int, block_size: int,
              rules: TransferRules) -> PlannedPull | None:
    """A pull for a request routed to ``chosen_id`` (holding ``chosen_blocks`` of it, device or host) when a
    holder among ``candidates`` (healthy, trusted replicas of any role) has more and pulling is cheaper."""
    holder_id, held = None, chosen_blocks
    for rid, m in device_matches.items():
        m = min(m, usable_blocks)
        if m > held and rid != chosen_id and rid in candidates:
            holder_id, held = rid, m
    if holder_id is None:
        return None
    rates = [load.prefill_tokens_per_s for load in loads.values() if load.prefill_tokens_per_s]
    priced = price_pull(loads[chosen_id], loads[holder_id], held - chosen_blocks, block_size,
                        sum(rates) / len(rates) if rates else None, rules)
    if priced is None or not priced[0] < priced[1]:
        return None
    return PlannedPull(holder_id, (held - chosen_blocks) * block_size, *priced)
