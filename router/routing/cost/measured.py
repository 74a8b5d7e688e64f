"""A replica's record as the price reads it: one float per input, NaN where the replica measured nothing.

``measured`` is the one place a ``ReplicaLoad`` becomes the price's inputs: the per-replica evaluation reads its
answer, the load columns (load_columns.py) copy it into their rows, and the fleet's priors (fleet.py) take their
rates by the same rule. A rate counts as measured only when it is a positive finite number (None, 0, negative,
NaN or infinite: not measured, so the fleet's prior prices it); a decode-step fit only when its three
coefficients are finite and not negative. So no NaN a replica reports reaches a price.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from kvmesh.replica.serving.load_report import DecodeStepLoad
from kvmesh.router.replicas.load import ReplicaLoad

MAX_HIT_FRACTION = 0.95
"""A replica's hit fraction counts up to this in the value of its cached tokens (``h / (1 - h)``, finite)."""
_NAN, _INF = math.nan, math.inf


def s_per_unit(rate: float | None) -> float:
    """Seconds per unit of a measured ``rate`` (NaN: not measured)."""
    return 1.0 / rate if rate and 0.0 < rate < _INF else _NAN


def decode_coefficients(step: DecodeStepLoad | None) -> tuple[float, float, float] | None:
    """(step_s, s_per_seq, s_per_context_token) of the replica's decode-step fit (a slope not reported: 0); None
    when it measured none, or reports one that is not a finite number of seconds."""
    if step is None or (c0 := step.step_s) is None:
        return None
    c1, c2 = step.s_per_seq or 0.0, step.s_per_context_token or 0.0
    return (c0, c1, c2) if 0.0 <= c0 < _INF and 0.0 <= c1 < _INF and 0.0 <= c2 < _INF else None


class Measured(NamedTuple):
    """One replica's inputs to the price (the load columns keep one array per field, the same names)."""

    spt: float
    """Seconds per prompt token it computes (NaN: not measured)."""
    h2d_spb: float
    """Seconds per byte it loads back from its host tier (NaN: not measured)."""
    pull_spb: float
    """Seconds per byte it pulls from a peer (NaN: not measured)."""
    pull_fixed: float
    """Seconds a pull costs it besides its bytes (NaN: not measured)."""
    lora_spb: float
    """Seconds per adapter byte it loads into a slot (NaN: not measured)."""
    block_bytes: float
    """Bytes of one KV block, as reported (0: not reported)."""
    coef_valid: bool
    """It measured its decode step (``coef0..2``; 0.0 each when not)."""
    coef0: float
    coef1: float
    coef2: float
    bytes_per_token: float
    """KV bytes of one token, as reported (0: not reported)."""
    backlog: float
    """Prompt tokens it prefills before a new request's (``ReplicaLoad.prefill_backlog``)."""
    batch: float
    """Requests sharing its decode steps (``ReplicaLoad.decode_load``)."""
    context: float
    """Its running requests' context: reported, else their number times the mean prompt sent there, else 0."""
    hit_worth: float
    """``h / (1 - h)``: hit tokens a token cached there brings (``h`` its recent hit fraction, capped)."""
    arrival: float
    """Requests per second sent there."""
    offset: float
    """Its TTFT correction's offset (correction.py)."""
    scale: float
    """Its TTFT correction's scale."""


RATES = 10
"""``Measured``'s first fields are its rates (what the columns derive the priced rates from)."""


def measured(load: ReplicaLoad) -> Measured:
    """``load`` as the price reads it."""
    step, lora = load.decode_step, load.lora
    coef = decode_coefficients(step)
    batch, recent_prompt, recent_requests = load.decode_load, load.recent_prompt, load.recent_requests
    hit = min(1.0 - load.recent_prefill / recent_prompt if recent_prompt > 0 else 0.0, MAX_HIT_FRACTION)
    fixed = load.pull_fixed_s
    return _new(Measured, (  # tuple.__new__: the named tuple's own __new__ costs a Python call per replica priced
        s_per_unit(load.prefill_tokens_per_s), s_per_unit(load.h2d_bytes_per_s), s_per_unit(load.pull_bytes_per_s),
        fixed if fixed is not None and 0.0 <= fixed < _INF else _NAN,
        _NAN if lora is None else s_per_unit(lora.load_bytes_per_s), float(load.kv_block_bytes or 0),
        coef is not None, *(coef or _NO_FIT), float(load.kv_bytes_per_token or 0),
        float(load.prefill_backlog), float(batch),
        float(step.context_tokens if step is not None and step.context_tokens else
              batch * recent_prompt / recent_requests if recent_requests > 0 else 0),
        hit / (1 - hit), load.arrival_rate, load.ttft_offset_s, load.ttft_correction))


_new = tuple.__new__
_NO_FIT = (0.0, 0.0, 0.0)
