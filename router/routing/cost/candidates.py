"""Every candidate replica priced for one request (estimate.py), with the pull each would make: the one price
``cache_aware`` chooses by, ``KVRouter`` reports (``RouteDecision.predicted_ttft_s``) and the pull and split
decisions use (router/routing/kv_placement.py).

For a candidate holding ``own`` leading blocks (device, or host tier past it: loaded back) while another holds
``best`` > ``own``, it may pull the difference instead of computing it (both must report KV transfer on): it pulls
when the pull costs fewer seconds than computing those tokens at its rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.cost.columns_price import (
    choice_columns,
    prefill_columns,
    pull_columns,
    row_estimate,
)
from kvmesh.router.routing.cost.estimate import TTFTEstimate, adapter_s, estimate, prefill_s_per_token
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.cost.prices import Prices
from kvmesh.router.routing.cost.pull import PullPriors, can_pull, pull_holder, pull_seconds


def price_all(loads: Mapping[ReplicaId, ReplicaLoad], device: Mapping[ReplicaId, int], host: Mapping[ReplicaId, int],
              prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None = None,
              lora_name: str | None = None, fleet: FleetRates | None = None) -> Prices:
    """``TTFTEstimate`` of every replica in ``loads`` for a prompt of ``prompt_tokens``
    (``device``/``host``: leading prompt blocks each holds per tier). ``loads`` as ``CandidateLoads`` (the
    router's columns) are priced in one vectorised pass (``price_columns``); a plain mapping one by one."""
    if fleet is None:
        fleet = loads.fleet() if type(loads) is CandidateLoads else FleetRates.of(loads.values())
    usable = reusable_blocks(prompt_tokens, block_size)  # an engine computes at least the last token
    holder, best = pull_holder(loads, device, usable, pulls)
    if type(loads) is CandidateLoads:  # an exact type test: isinstance of a Mapping ABC costs its check
        return price_columns(loads, device, host, prompt_tokens, block_size, step_tokens, pulls, lora_name, fleet,
                             holder, best)
    return Prices.of({rid: _price(loads, device, host, prompt_tokens, block_size, step_tokens, pulls, lora_name, fleet,
                                  usable, holder, best, rid) for rid in loads})


def price_one(loads: Mapping[ReplicaId, ReplicaLoad], device: Mapping[ReplicaId, int], host: Mapping[ReplicaId, int],
              prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None,
              lora_name: str | None, replica_id: ReplicaId) -> TTFTEstimate:
    """``price_all``'s estimate of ``replica_id`` alone (a candidate of ``loads``), without pricing the others."""
    fleet = loads.fleet() if type(loads) is CandidateLoads else FleetRates.of(loads.values())
    usable = reusable_blocks(prompt_tokens, block_size)  # an engine computes at least the last token
    holder, best = pull_holder(loads, device, usable, pulls)
    return _price(loads, device, host, prompt_tokens, block_size, step_tokens, pulls, lora_name, fleet, usable,
                  holder, best, replica_id)


def _price(loads: Mapping[ReplicaId, ReplicaLoad], device: Mapping[ReplicaId, int], host: Mapping[ReplicaId, int],
           prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None, lora_name: str | None,
           fleet: FleetRates, usable: int, holder: ReplicaId | None, best: int, rid: ReplicaId) -> TTFTEstimate:
    """The estimate of candidate ``rid``, pulling from ``holder`` (which holds ``best`` blocks) when that is cheaper
    than computing them (module doc)."""
    load = loads[rid]
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
    return estimate(load, fleet, prompt_tokens, computed, extra, block_size, step_tokens, pull_s, pulled, lora_name)


def price_columns(loads: CandidateLoads, device: Mapping[ReplicaId, int], host: Mapping[ReplicaId, int],
                  prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None,
                  lora_name: str | None, fleet: FleetRates, holder: ReplicaId, best: int) -> Prices:
    """Every candidate's ``choice_s`` in one pass over the columns (columns_price.py), pulls from ``holder`` (which
    holds ``best`` blocks) included; a candidate's full estimate is read from the same pass when asked for."""
    cols, mask = loads.columns, loads.mask
    row_of, n = cols.row, len(cols.ids)
    usable = reusable_blocks(prompt_tokens, block_size)
    own = _scatter(device, row_of, n, usable)
    extra = None
    if host:
        extra = np.maximum(_scatter(host, row_of, n, usable) - own, 0)
        own = own + extra
    spt, all_priced = prefill_columns(cols, fleet)
    pulled = pull_s = None
    if holder is not None:
        may_pull = cols.kv_transfer & mask
        if (row := row_of(holder)) is not None:
            may_pull[row] = False
            if (layout := cols.loads[row].kv_layout) is not None:  # only a replica of its KV layout pulls from it
                may_pull &= np.fromiter((load.kv_layout == layout for load in cols.loads), bool, n)
        pulled, pull_s = pull_columns(cols, fleet, pulls, may_pull, best - own, block_size, spt, all_priced)
    if not prompt_tokens:
        computed = np.zeros(n, dtype=np.int64)
    else:
        computed = np.maximum(prompt_tokens - (own if pulled is None else own + pulled) * block_size, 1)
    adapter = None
    if lora_name is not None and cols.has_lora.any():
        adapter, loads_by_row = np.zeros(n), cols.loads
        for row in np.flatnonzero(cols.has_lora & mask).tolist():
            adapter[row] = adapter_s(loads_by_row[row], fleet, lora_name)
    parts = choice_columns(cols, fleet, spt, all_priced, computed, extra, pulled, pull_s, adapter, block_size,
                           step_tokens)
    choice = parts.choice_s
    choice[loads.outside] = np.inf

    def estimate_of(rid: ReplicaId) -> TTFTEstimate:
        return row_estimate(parts, cols, fleet, row_of(rid), prompt_tokens, spt, all_priced, computed, pulled)

    return Prices(cols.ids, row_of, mask, choice, computed, {}, estimate_of)


def _scatter(matches: Mapping[ReplicaId, int], row_of: Callable[[ReplicaId], int | None], n: int,
             usable: int) -> np.ndarray:
    """Leading blocks per row (at most ``usable``), 0 where ``matches`` has none (``row_of``: a replica's row)."""
    out = np.zeros(n, dtype=np.int64)
    for rid, m in matches.items():
        row = row_of(rid)
        if row is not None:
            out[row] = min(m, usable)
    return out
