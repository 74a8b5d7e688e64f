"""Every candidate replica priced for one request (estimate.py), with the pull each would make: the one price
``cache_aware`` chooses by, ``KVRouter`` reports (``RouteDecision.predicted_ttft_s``) and the pull and split
decisions use (router/routing/kv_placement.py).

For a candidate holding ``own`` leading blocks (device, or host tier past it: loaded back) while another holds
``best`` > ``own``, it may pull the difference instead of computing it (both must report KV transfer on): it pulls
when the pull costs fewer seconds than computing those tokens at its rate.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.routing.cost.estimate import TTFTEstimate, estimate, prefill_s_per_token
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.pull import PullPriors, can_pull, pull_seconds
from kvmesh.router.routing.load import ReplicaLoad


def price_all(loads: Mapping[Hashable, ReplicaLoad], device: Mapping[Hashable, int], host: Mapping[Hashable, int],
              prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None = None,
              lora_name: str | None = None, fleet: FleetRates | None = None,
              only: Hashable | None = None) -> dict[Hashable, TTFTEstimate]:
    """``TTFTEstimate`` of every replica in ``loads`` (``only``: of that one) for a prompt of ``prompt_tokens``
    (``device``/``host``: leading prompt blocks each holds per tier)."""
    fleet = FleetRates.of(loads.values()) if fleet is None else fleet
    usable = reusable_blocks(prompt_tokens, block_size)  # an engine computes at least the last token
    holder, best = None, 0
    if pulls is not None and pulls.enabled:
        for rid, m in device.items():
            if m > best and rid in loads and loads[rid].kv_transfer_enabled:
                holder, best = rid, m
        best = min(best, usable)
    out = {}
    for rid, load in loads.items() if only is None else ((only, loads[only]),):
        d = min(device.get(rid, 0), usable)
        extra = max(0, min(host.get(rid, 0), usable) - d)
        own = d + extra
        pulled, pull_s = 0, 0.0
        if holder is not None and best > own and rid != holder and can_pull(load, loads[holder], pulls):
            seconds = pull_seconds(load, fleet, best - own, block_size, pulls)
            spt = prefill_s_per_token(load, fleet)
            if seconds is not None and spt is not None and seconds < (best - own) * block_size * spt:
                pulled, pull_s = best - own, seconds
        computed = max(prompt_tokens - (own + pulled) * block_size, 1) if prompt_tokens else 0
        out[rid] = estimate(load, fleet, prompt_tokens, computed, extra, block_size, step_tokens, pull_s, pulled,
                            lora_name)
    return out
