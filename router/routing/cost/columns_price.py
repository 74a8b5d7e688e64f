"""candidates.py's price for every replica at once, from the loads as columns (router/routing/cost/load_columns.py).

The same arithmetic as estimate.py, pull.py and candidates.py, term by term and in the same order, on numpy arrays:
the results are the same floats (tests/router/test_pruned_routing.py compares them on randomized fleets), so a
decision made from these equals one made from the per-replica estimates. A change to the cost's terms there is
mirrored here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from kvmesh.router.routing.cost.estimate import TTFTEstimate, decode_step_s
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.load_columns import LoadColumns
from kvmesh.router.routing.cost.pull import PullPriors


def prefill_columns(cols: LoadColumns, fleet: FleetRates) -> tuple[np.ndarray, bool]:
    """estimate.prefill_s_per_token per row, unknown ones as 1.0; and whether every row's rate is known (the fleet
    has one for those that measured none; else the rows that measured none are unpriced, ``cols.spt`` NaN)."""
    return _rates(cols, fleet)[:2]


def _rates(cols: LoadColumns, fleet: FleetRates) -> tuple:
    """What depends on the rows' rates and the fleet's priors alone, kept until either changes: (seconds per prompt
    token, all priced, the decode step's coefficients with the fleet's where a row measured none (None: none
    anywhere))."""
    key = (cols.rates_version, fleet)
    if cols.derived is not None and cols.derived[0] == key:
        return cols.derived[1]
    prior = fleet.prefill_s_per_token
    spt = np.where(np.isnan(cols.spt), 1.0 if prior is None else prior, cols.spt)
    valid, coef = cols.coef_valid, fleet.decode_step
    coefs = None if coef is None else tuple(np.where(valid, own, c) for own, c in
                                            zip((cols.coef0, cols.coef1, cols.coef2), coef, strict=True))
    derived = (spt, prior is not None, coefs)
    cols.derived = (key, derived)
    return derived


def pull_columns(cols: LoadColumns, fleet: FleetRates, priors: PullPriors, may_pull: np.ndarray,
                 missing: np.ndarray, block_size: int, spt: np.ndarray, all_priced: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(blocks pulled, pull seconds) per row: ``missing`` blocks where the row ``may_pull`` and pulling them costs
    fewer seconds than computing them (candidates.py, pull.pull_seconds); 0 elsewhere."""
    nbytes = _block_bytes(cols, fleet, block_size)
    prior = fleet.pull_s_per_byte or (1.0 / priors.bytes_per_s if priors.bytes_per_s else None)
    s_per_byte = np.where(np.isnan(cols.pull_spb), np.nan if prior is None else prior, cols.pull_spb)
    fixed_prior = priors.overhead_s if fleet.pull_fixed_s is None else fleet.pull_fixed_s
    fixed = np.where(np.isnan(cols.pull_fixed), fixed_prior, cols.pull_fixed)
    seconds = missing * nbytes * s_per_byte + fixed
    known = ~np.isnan(seconds) if all_priced else ~np.isnan(seconds) & ~np.isnan(cols.spt)
    pull = may_pull & (missing > 0) & known & (seconds < missing * block_size * spt)
    return np.where(pull, missing, 0), np.where(pull, seconds, 0.0)


@dataclass(frozen=True, slots=True)
class ColumnParts:
    """One request's ``TTFTEstimate`` on every row, by part (arrays over rows; None: 0.0 on every row)."""

    queue_s: np.ndarray
    interleave_s: np.ndarray
    prefill_s: np.ndarray
    load_back_s: np.ndarray | None
    pull_s: np.ndarray | None
    adapter_s: np.ndarray | None
    stall_s: np.ndarray
    delay_s: np.ndarray
    evict_s: np.ndarray
    ttft_s: np.ndarray
    """Corrected (correction.corrected)."""
    choice_s: np.ndarray


def choice_columns(cols: LoadColumns, fleet: FleetRates, spt: np.ndarray, all_priced: bool, own_tokens: np.ndarray,
                   host_blocks: np.ndarray | None, pulled: np.ndarray | None, pull_s: np.ndarray | None,
                   adapter_s: np.ndarray | None,
                   block_size: int, step_tokens: float) -> ColumnParts:
    """``TTFTEstimate`` per row, by part, for a request computing ``own_tokens`` there, loading ``host_blocks``
    back, pulling ``pulled`` blocks in ``pull_s`` and loading its adapter in ``adapter_s`` (each None: none
    anywhere)."""
    backlog, batch = cols.backlog, cols.batch
    if step_tokens > 0 and float(step_tokens).is_integer():
        # estimate's -(-x // t) is the exact ceiling; x / t rounded cannot cross an integer for whole x, t < 2**53
        steps = np.ceil((backlog + own_tokens) / step_tokens)
    else:
        steps = -np.floor_divide(-(backlog + own_tokens), step_tokens) if step_tokens > 0 else np.ones_like(spt)
    step_s = _decode_step_s(cols, fleet, batch, cols.context, spt)
    prefill = own_tokens * spt
    queue = backlog * spt
    # estimate: max(steps, 1) * decode_step_s if batch else 0.0, and decode_step_s is 0.0 for batch <= 0
    interleave = np.where(batch > 0, np.maximum(steps, 1) * step_s, 0.0)
    raw = queue + interleave + prefill  # TTFTEstimate.raw_s; a term of 0.0 adds nothing
    load_back = None
    if host_blocks is not None:
        load_back = _load_back_s(cols, fleet, host_blocks, block_size, spt)
        raw = raw + load_back
    if pulled is not None:
        raw = raw + pull_s
    if adapter_s is not None:
        raw = raw + adapter_s
    ttft = cols.offset + cols.scale * raw  # correction.corrected
    stall = batch * prefill
    delay = cols.arrival * ttft * prefill
    if not all_priced:  # unpriced: no time scale for the rate
        delay = np.where(np.isnan(cols.spt), 0.0, delay)
    stored = own_tokens
    if pulled is not None or host_blocks is not None:
        stored = stored + ((0 if pulled is None else pulled) + (0 if host_blocks is None else host_blocks)) * block_size
    evict = cols.hit_worth * stored * spt
    return ColumnParts(queue, interleave, prefill, load_back, pull_s, adapter_s, stall, delay, evict, ttft,
                       ttft + stall + delay + evict)


def row_estimate(parts: ColumnParts, cols: LoadColumns, fleet: FleetRates, row: int, prompt_tokens: int,
                 spt: np.ndarray, all_priced: bool, own_tokens: np.ndarray, pulled: np.ndarray | None
                 ) -> TTFTEstimate:
    """Row ``row``'s ``TTFTEstimate`` from ``parts`` (its pace priced now, as estimate.py does)."""
    def at(part: np.ndarray | None) -> float:
        return 0.0 if part is None else float(part[row])

    s_per_token, load = float(spt[row]), cols.loads[row]
    pace = decode_step_s(load, fleet, load.decode_load + 1, float(cols.context[row]) + prompt_tokens, s_per_token)
    return TTFTEstimate(queue_s=at(parts.queue_s), interleave_s=at(parts.interleave_s), prefill_s=at(parts.prefill_s),
                        load_back_s=at(parts.load_back_s), pull_s=at(parts.pull_s), adapter_s=at(parts.adapter_s),
                        stall_s=at(parts.stall_s), pace_s=pace, evict_s=at(parts.evict_s), delay_s=at(parts.delay_s),
                        corrected_s=at(parts.ttft_s), priced=all_priced or not np.isnan(cols.spt[row]),
                        own_tokens=int(own_tokens[row]), pulled_blocks=0 if pulled is None else int(pulled[row]))


def _decode_step_s(cols: LoadColumns, fleet: FleetRates, batch: np.ndarray, context: np.ndarray,
                   spt: np.ndarray) -> np.ndarray:
    """estimate.decode_step_s per row with a batch (> 0; the caller zeroes the others)."""
    coefs = _rates(cols, fleet)[2]
    if coefs is None:
        own = cols.coef0 + cols.coef1 * batch + cols.coef2 * context
        return np.where(cols.coef_valid, own, batch * spt)  # no step measured anywhere: a row costs a prompt token
    return coefs[0] + coefs[1] * batch + coefs[2] * context


def _block_bytes(cols: LoadColumns, fleet: FleetRates, block_size: int) -> np.ndarray:
    """estimate.block_bytes per row (NaN: unknown)."""
    prior = np.nan if fleet.kv_block_bytes is None else fleet.kv_block_bytes
    return np.where(cols.block_bytes != 0, cols.block_bytes,
                    np.where(cols.bytes_per_token != 0, cols.bytes_per_token * block_size, prior))


def _load_back_s(cols: LoadColumns, fleet: FleetRates, host_blocks: np.ndarray, block_size: int,
                 spt: np.ndarray) -> np.ndarray:
    """estimate.load_back_s per row."""
    nbytes = _block_bytes(cols, fleet, block_size)
    prior = np.nan if fleet.h2d_s_per_byte is None else fleet.h2d_s_per_byte
    s_per_byte = np.where(np.isnan(cols.h2d_spb), prior, cols.h2d_spb)
    unknown = np.isnan(nbytes) | np.isnan(s_per_byte)
    seconds = np.where(unknown, host_blocks * block_size * spt, host_blocks * nbytes * s_per_byte)
    return np.where(host_blocks == 0, 0.0, seconds)
