"""The price's terms, listed once: a request's predicted seconds on a candidate replica, by part.

Each term is written once, here, over values that are one replica's (floats: estimate.py, candidates.py) or every
replica's at once (arrays over the load columns' rows: columns_price.py); ``ops`` (ops.py) says how either
evaluation chooses and bounds, the arithmetic is the same. The inputs are a replica's measured record
(measured.py), the fleet's slowest rates where it measured none (fleet.py), and the request::

    queue_s      = backlog * s_per_token                     prompt tokens queued ahead, at its prefill rate
    interleave_s = steps * decode_step_s(batch, context)     the running batch's decode steps until our first token
                   steps = ceil((backlog + own) / step_tokens), at least 1 (0 with no batch)
    prefill_s    = own * s_per_token                         own = prompt - what it holds or pulls (at least 1)
    load_back_s  = host blocks * block bytes * h2d s/byte    its host tier's part of the prefix, copied back
    pull_s       = pulled blocks * block bytes * pull s/byte + pull fixed s   where that beats computing them
    adapter_s    = adapter bytes * load s/byte               the request's LoRA adapter, when not resident there
    ttft_s       = offset + scale * (sum of the above)      the replica's observed/predicted fit (correction.py)
    stall_s      = batch * prefill_s                         the delay its prefill puts on the decodes there
    delay_s      = arrival rate * ttft_s * prefill_s         the arrivals its prefill delays (0 unpriced)
    evict_s      = h / (1 - h) * stored tokens * s_per_token  the hits the tokens it stores push out
    choice_s     = ttft_s + stall_s + delay_s + evict_s      what ``cache_aware`` minimizes
    pace_s       = decode_step_s(batch + 1, context + prompt)  seconds per output token once it decodes

``decode_step_s(b, c) = step_s + s_per_seq * b + s_per_context_token * c`` (the replica's fit); before any replica
measured one, a decode row is priced as one prompt token. A prefill rate nobody measured yet leaves the price
unpriced (``priced`` False: its parts are then in prompt-token units, so candidates still compare). The adapter's
term reads the replica's adapter table, one replica at a time (estimate.adapter_s), in both evaluations.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvmesh.router.routing.cost.fleet import FleetRates, PullPriors
from kvmesh.router.routing.cost.ops import NAN

Value = Any
"""A float (one replica) or a numpy array over rows (every replica): numpy's operators type as Any."""
_new = tuple.__new__
"""Builds a named tuple below without its Python-level ``__new__`` (a call per replica priced)."""


class Rates(NamedTuple):
    """The rates a price is computed with: the replica's own, else the fleet's slowest (one replica or every row)."""

    m: Any
    """The measured inputs: a ``Measured`` (one replica) or the ``LoadColumns`` (every row; same field names)."""
    spt: Value
    """Seconds per prompt token (1.0 where no replica measured one: unpriced)."""
    priced: Value
    """The prefill rate is measured (its own or the fleet's; True: everywhere)."""
    coef_known: Value
    """A decode-step fit is known (``coef0..2``; else a decode row costs a prompt token; True: everywhere)."""
    coef0: Value
    coef1: Value
    coef2: Value
    h2d_spb: Value
    """Seconds per byte loaded back (NaN: unknown)."""


def rates(m: Any, fleet: FleetRates, ops: Any) -> Rates:
    """``m``'s rates with the fleet's priors where it measured none (NaN: not measured; a value the same on every
    row stays a Python value, so the array evaluation skips a choice it does not need)."""
    prior, coef, h2d = fleet.prefill_s_per_token, fleet.decode_step, fleet.h2d_s_per_byte
    spt, valid, h2d_spb = m.spt, m.coef_valid, m.h2d_spb
    known = spt == spt
    # ``x if cond is True else ops.where(cond, x, y)``: one replica's answer without a call (the same value)
    if known is not True:
        spt = ops.where(known, spt, 1.0 if prior is None else prior)
    if coef is None or valid is True:
        c0, c1, c2, coef_known = m.coef0, m.coef1, m.coef2, True if coef is not None else valid
    else:
        where = ops.where
        c0, c1, c2, coef_known = where(valid, m.coef0, coef[0]), where(valid, m.coef1, coef[1]), \
            where(valid, m.coef2, coef[2]), True
    if (h2d_known := h2d_spb == h2d_spb) is not True:
        h2d_spb = ops.where(h2d_known, h2d_spb, NAN if h2d is None else h2d)
    return _new(Rates, (m, spt, True if prior is not None else known, coef_known, c0, c1, c2, h2d_spb))


def decode_step_s(r: Rates, batch: Value, context: Value, ops: Any) -> Value:
    """Seconds of one decode step of ``batch`` sequences over ``context`` tokens."""
    fit = r.coef0 + r.coef1 * batch + r.coef2 * context
    return fit if r.coef_known is True else ops.where(r.coef_known, fit, batch * r.spt)


def pace_s(r: Rates, batch: Value, context: Value, prompt_tokens: int, ops: Any) -> Value:
    """Seconds per output token once the request decodes there, its ``batch`` and ``context`` before it (0 with no
    batch)."""
    batch = batch + 1
    return ops.where(batch > 0, decode_step_s(r, batch, context + prompt_tokens, ops), 0.0)


def block_bytes(m: Any, fleet: FleetRates, block_size: int, ops: Any) -> Value:
    """Bytes one KV block moves: reported, else from its bytes per token, else the fleet's (NaN: unknown)."""
    prior = NAN if fleet.kv_block_bytes is None else fleet.kv_block_bytes
    return ops.where(m.block_bytes != 0, m.block_bytes,
                     ops.where(m.bytes_per_token != 0, m.bytes_per_token * block_size, prior))


def load_back_s(r: Rates, fleet: FleetRates, host_blocks: Value, block_size: int, ops: Any) -> Value:
    """Seconds to copy ``host_blocks`` back from the host tier (a size or rate unknown: as recomputing them)."""
    nbytes = block_bytes(r.m, fleet, block_size, ops)
    seconds = ops.where(ops.known(nbytes) & ops.known(r.h2d_spb), host_blocks * nbytes * r.h2d_spb,
                        host_blocks * block_size * r.spt)
    return ops.where(host_blocks == 0, 0.0, seconds)


def pull_cost_s(m: Any, fleet: FleetRates, priors: PullPriors, num_blocks: Value, block_size: int,
                ops: Any) -> Value:
    """Seconds to pull ``num_blocks`` from a peer: bytes over its pull rate plus its fixed cost, each the fleet's
    where it measured none, else the router's priors (NaN: cannot be priced)."""
    prior = fleet.pull_s_per_byte or (1.0 / priors.bytes_per_s if priors.bytes_per_s else None)
    s_per_byte = ops.where(ops.known(m.pull_spb), m.pull_spb, NAN if prior is None else prior)
    fixed_prior = priors.overhead_s if fleet.pull_fixed_s is None else fleet.pull_fixed_s
    fixed = ops.where(ops.known(m.pull_fixed), m.pull_fixed, fixed_prior)
    return num_blocks * block_bytes(m, fleet, block_size, ops) * s_per_byte + fixed


class CandidateWork(NamedTuple):
    """What a request does on a candidate: the tokens it computes, the blocks it loads back and pulls."""

    computed: Value
    host_blocks: Value | None
    """Blocks loaded back from the host tier past its device prefix (None: none anywhere)."""
    pulled: Value | None
    """Blocks pulled from the holder (None: no pull anywhere)."""
    pull_s: Value | None


def candidate(r: Rates, fleet: FleetRates, device: Value, host: Value | None, prompt_tokens: int, block_size: int,
              may_pull: Value | None, best: int, priors: PullPriors | None, ops: Any) -> CandidateWork:
    """A candidate holding ``device`` leading blocks (``host``: on its host tier, None: none) when the holder
    holds ``best``: it pulls the difference where it ``may_pull`` and the pull costs fewer seconds than computing
    those tokens at its rate (``device``, ``host``, ``best``: at most the prompt's reusable blocks)."""
    extra = None if host is None else ops.maximum(host - device, 0)
    own = device if extra is None else device + extra
    pulled = pull_s = None
    if may_pull is not None:
        missing = best - own
        seconds = pull_cost_s(r.m, fleet, priors, missing, block_size, ops)
        pull = (may_pull & (missing > 0) & ops.known(seconds) & r.priced
                & (seconds < missing * block_size * r.spt))
        pulled, pull_s = ops.where(pull, missing, 0), ops.where(pull, seconds, 0.0)
        own = own + pulled
    computed = ops.maximum(prompt_tokens - own * block_size, 1) if prompt_tokens else own * 0
    return _new(CandidateWork, (computed, extra, pulled, pull_s))


class Parts(NamedTuple):
    """A request's price on one replica (floats) or every row (arrays), by part (None: 0.0 everywhere)."""

    queue_s: Value
    interleave_s: Value
    prefill_s: Value
    load_back_s: Value | None
    pull_s: Value | None
    adapter_s: Value | None
    stall_s: Value
    delay_s: Value
    evict_s: Value
    ttft_s: Value
    """Corrected (correction.py)."""
    choice_s: Value


def raw_s(queue: Value, interleave: Value, prefill: Value, load_back: Value | None, pull: Value | None,
          adapter: Value | None) -> Value:
    """The predicted TTFT before the replica's correction: the sum of its parts (None: 0.0)."""
    raw = queue + interleave + prefill
    for part in (load_back, pull, adapter):
        if part is not None:
            raw = raw + part
    return raw


def choice_s(ttft: Value, stall: Value, delay: Value, evict: Value) -> Value:
    """What ``cache_aware`` minimizes: its TTFT and the seconds its prefill takes from the other requests there."""
    return ttft + stall + delay + evict


def price(r: Rates, fleet: FleetRates, c: CandidateWork, adapter: Value | None, block_size: int, step_tokens: float,
          ops: Any) -> Parts:
    """The parts of the price of candidate ``c`` (``adapter``: its adapter's load seconds, None: none)."""
    m, spt, own = r.m, r.spt, c.computed
    backlog, batch = m.backlog, m.batch
    steps = ops.steps(backlog + own, step_tokens)
    queue, prefill = backlog * spt, own * spt
    interleave = ops.where(batch > 0, ops.maximum(steps, 1) * decode_step_s(r, batch, m.context, ops), 0.0)
    host = c.host_blocks
    load_back = None if host is None else load_back_s(r, fleet, host, block_size, ops)
    ttft = m.offset + m.scale * raw_s(queue, interleave, prefill, load_back, c.pull_s, adapter)
    stall = batch * prefill
    delay = m.arrival * ttft * prefill
    if r.priced is not True:
        delay = ops.where(r.priced, delay, 0.0)  # unpriced: no time scale for the rate
    stored = own  # computed, pulled, loaded back: all evict
    if c.pulled is not None or host is not None:
        stored = stored + ((0 if c.pulled is None else c.pulled) + (0 if host is None else host)) * block_size
    evict = m.hit_worth * stored * spt
    return _new(Parts, (queue, interleave, prefill, load_back, c.pull_s, adapter, stall, delay, evict, ttft,
                        choice_s(ttft, stall, delay, evict)))
