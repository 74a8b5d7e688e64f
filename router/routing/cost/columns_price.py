"""The price's terms (terms.py) evaluated on every replica at once: numpy arrays over the load columns' rows
(router/routing/cost/load_columns.py), what candidates.py prices many candidates with.

The terms are the ones estimate.py evaluates on one replica's floats, under ``ARRAY`` instead of ``SCALAR``
(ops.py): the same floats, so a decision made from these equals one made from the per-replica estimates. What
depends on the rows' rates and the fleet's priors alone is kept until either changes.
"""

from __future__ import annotations

import numpy as np
from kvmesh.router.routing.cost import terms
from kvmesh.router.routing.cost.estimate import TTFTEstimate
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.load_columns import LoadColumns
from kvmesh.router.routing.cost.ops import ARRAY, SCALAR


def column_rates(cols: LoadColumns, fleet: FleetRates) -> terms.Rates:
    """``terms.rates`` of every row, kept until a row's rates or the fleet's priors change."""
    key = (cols.rates_version, fleet)
    if cols.derived is not None and cols.derived[0] == key:
        return cols.derived[1]
    r = terms.rates(cols, fleet, ARRAY)
    cols.derived = (key, r)
    return r


def row_estimate(parts: terms.Parts, r: terms.Rates, c: terms.CandidateWork, row: int,
                 prompt_tokens: int) -> TTFTEstimate:
    """Row ``row``'s ``TTFTEstimate`` from ``parts`` (its pace priced now, on that row alone)."""
    def at(part: np.ndarray | None) -> float:
        return 0.0 if part is None else float(part[row])

    def pick(value):
        return value[row].item() if isinstance(value, np.ndarray) else value

    cols = r.m
    one = terms.Rates(None, *(pick(v) for v in (r.spt, r.priced, r.coef_known, r.coef0, r.coef1, r.coef2, r.h2d_spb)))
    pace = terms.pace_s(one, cols.batch[row].item(), cols.context[row].item(), prompt_tokens, SCALAR)
    return TTFTEstimate(queue_s=at(parts.queue_s), interleave_s=at(parts.interleave_s), prefill_s=at(parts.prefill_s),
                        load_back_s=at(parts.load_back_s), pull_s=at(parts.pull_s), adapter_s=at(parts.adapter_s),
                        stall_s=at(parts.stall_s), pace_s=pace,
                        evict_s=at(parts.evict_s), delay_s=at(parts.delay_s), corrected_s=at(parts.ttft_s),
                        priced=one.priced, own_tokens=int(c.computed[row]),
                        pulled_blocks=0 if c.pulled is None else int(c.pulled[row]))
