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
from kvmesh.router.routing.cost import terms
from kvmesh.router.routing.cost.columns_price import column_rates, row_estimate
from kvmesh.router.routing.cost.estimate import TTFTEstimate, adapter_s, estimate_of
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.load_columns import CandidateLoads
from kvmesh.router.routing.cost.measured import measured
from kvmesh.router.routing.cost.ops import ARRAY, SCALAR
from kvmesh.router.routing.cost.prices import Prices
from kvmesh.router.routing.cost.pull import PullPriors, can_pull, pull_holder


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
    than computing them (module doc): the terms on its floats."""
    load = loads[rid]
    r = terms.rates(measured(load), fleet, SCALAR)
    held = host.get(rid)
    may_pull = None if holder is None else rid != holder and can_pull(load, loads[holder], pulls)
    c = terms.candidate(r, fleet, min(device.get(rid, 0), usable), None if held is None else min(held, usable),
                        prompt_tokens, block_size, may_pull, best, pulls, SCALAR)
    parts = terms.price(r, fleet, c, adapter_s(load, fleet, lora_name), block_size, step_tokens, SCALAR)
    return estimate_of(parts, r, c, prompt_tokens)


def price_columns(loads: CandidateLoads, device: Mapping[ReplicaId, int], host: Mapping[ReplicaId, int],
                  prompt_tokens: int, block_size: int, step_tokens: float, pulls: PullPriors | None,
                  lora_name: str | None, fleet: FleetRates, holder: ReplicaId, best: int) -> Prices:
    """Every candidate's ``choice_s`` in one pass over the columns: the terms on arrays (columns_price.py), pulls
    from ``holder`` (which holds ``best`` blocks) included; a candidate's full estimate is read from the same pass
    when asked for."""
    cols, mask = loads.columns, loads.mask
    row_of, n = cols.row, len(cols.ids)
    usable = reusable_blocks(prompt_tokens, block_size)
    r = column_rates(cols, fleet)
    may_pull = None
    if holder is not None:
        may_pull = cols.kv_transfer & mask
        if (row := row_of(holder)) is not None:
            may_pull[row] = False
            if (layout := cols.loads[row].kv_layout) is not None:  # only a replica of its KV layout pulls from it
                may_pull &= np.fromiter((load.kv_layout == layout for load in cols.loads), bool, n)
    c = terms.candidate(r, fleet, _scatter(device, row_of, n, usable),
                        _scatter(host, row_of, n, usable) if host else None, prompt_tokens, block_size, may_pull,
                        best, pulls, ARRAY)
    adapter = None
    if lora_name is not None and cols.has_lora.any():
        adapter, loads_by_row = np.zeros(n), cols.loads
        for row in np.flatnonzero(cols.has_lora & mask).tolist():
            adapter[row] = adapter_s(loads_by_row[row], fleet, lora_name)
    parts = terms.price(r, fleet, c, adapter, block_size, step_tokens, ARRAY)
    choice = parts.choice_s
    choice[loads.outside] = np.inf

    def estimate_of_row(rid: ReplicaId) -> TTFTEstimate:
        return row_estimate(parts, r, c, row_of(rid), prompt_tokens)

    return Prices(cols.ids, row_of, mask, choice, c.computed, {}, estimate_of_row)


def _scatter(matches: Mapping[ReplicaId, int], row_of: Callable[[ReplicaId], int | None], n: int,
             usable: int) -> np.ndarray:
    """Leading blocks per row (at most ``usable``), 0 where ``matches`` has none (``row_of``: a replica's row)."""
    out = np.zeros(n, dtype=np.int64)
    for rid, m in matches.items():
        row = row_of(rid)
        if row is not None:
            out[row] = min(m, usable)
    return out
