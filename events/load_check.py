"""What a router takes of a replica's published load (events/load.py): every update is checked at intake.

    admit(update) -> update      the update, its claims clamped; ``ValueError`` naming what was wrong: refused

On a plain stream nothing proves who wrote an update, so an update is held to what one replica could truthfully say
about itself. Malformed values are refused whole (the last good update stands): a float that is not finite, a
count, rate or number below 0, a KV usage outside [0, 1], a seq or epoch outside a 63-bit range, more router ids
than a replica keeps or a booking number beyond what a booking header carries. What is well formed but beyond any
real replica is clamped, so the worst a lying publisher does is make its own replica look as busy as one that
stopped answering, or as idle as one that has nothing to do: counts and tokens to ``MAX_CLAIMED_*``, speeds to
``MAX_*_PER_S``, a decode step to ``MAX_DECODE_STEP_S``, the decayed prompt sums so that uncached <= prompt.
It never reaches below what the router knows itself (its own requests there, ``ReplicaLoad.decode_load``), and
acknowledges none of this router's requests it never booked (router/replicas/bookings.py).
"""

from __future__ import annotations

import math

import msgspec
from kvmesh.events.load import ReplicaLoadUpdate

__all__ = ["MAX_CLAIMED_REQUESTS", "MAX_CLAIMED_TOKENS", "MAX_BOOKING", "MAX_ROUTER_IDS", "admit"]

MAX_CLAIMED_REQUESTS = 1 << 16
"""Running (and, apart, waiting) requests one update may claim; beyond it every policy already routes elsewhere."""
MAX_CLAIMED_TOKENS = 1 << 32
"""Queued prefill tokens one update may claim."""
MAX_PREFILL_TOKENS_PER_S = 1e8
"""Fastest prefill one update may claim (tokens per second)."""
MAX_DECODE_STEP_S = 60.0
"""Slowest decode step one update may claim (seconds)."""
MAX_ARRIVALS_PER_S = 1e6
"""Highest request rate one update may claim."""
MAX_DECAYED_SUM = 1e15
"""Largest decayed prompt sum (``recent_*``) one update may claim."""
MAX_ROUTER_IDS = 256
"""Router ids one update may name in ``accepted`` (a replica keeps as many: events/publish/load_ledger.py)."""
MAX_ROUTER_ID_CHARS = 64
"""Longest router id (the booking header's, replica/openai/router_booking.py)."""
MAX_BOOKING = 10**18 - 1
"""Highest booking number (the 18 digits a booking header carries)."""
_MAX_SEQ = (1 << 63) - 1


def admit(update: ReplicaLoadUpdate) -> ReplicaLoadUpdate:
    """``update`` with its claims clamped; ValueError (what was wrong, by field) when it is refused."""
    u = update
    _check(u)
    clamped: dict[str, float] = {}
    for name, value, top in (("num_running", u.num_running, MAX_CLAIMED_REQUESTS),
                             ("num_waiting", u.num_waiting, MAX_CLAIMED_REQUESTS),
                             ("queued_prefill_tokens", u.queued_prefill_tokens, MAX_CLAIMED_TOKENS),
                             ("prefill_tokens_per_s", u.prefill_tokens_per_s, MAX_PREFILL_TOKENS_PER_S),
                             ("decode_step_s", u.decode_step_s, MAX_DECODE_STEP_S),
                             ("arrival_rate", u.arrival_rate, MAX_ARRIVALS_PER_S),
                             ("recent_prompt", u.recent_prompt, MAX_DECAYED_SUM),
                             ("recent_requests", u.recent_requests, MAX_DECAYED_SUM)):
        if value is not None and value > top:
            clamped[name] = top
    prompt = clamped.get("recent_prompt", u.recent_prompt)
    if u.recent_prefill > prompt:
        clamped["recent_prefill"] = prompt
    return msgspec.structs.replace(u, **clamped) if clamped else u


def _check(u: ReplicaLoadUpdate) -> None:
    for name, value in (("ts", u.ts), ("kv_usage", u.kv_usage), ("prefill_tokens_per_s", u.prefill_tokens_per_s),
                        ("decode_step_s", u.decode_step_s), ("arrival_rate", u.arrival_rate),
                        ("recent_prefill", u.recent_prefill), ("recent_prompt", u.recent_prompt),
                        ("recent_requests", u.recent_requests), ("churn_tau_s", u.churn_tau_s)):
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} is {value}; a finite number is expected")
    for name, value in (("seq", u.seq), ("epoch", u.epoch), ("num_running", u.num_running),
                        ("num_waiting", u.num_waiting), ("queued_prefill_tokens", u.queued_prefill_tokens),
                        ("engine_steps", u.engine_steps), ("decode_step_s", u.decode_step_s),
                        ("arrival_rate", u.arrival_rate), ("recent_prefill", u.recent_prefill),
                        ("recent_prompt", u.recent_prompt), ("recent_requests", u.recent_requests),
                        ("churn_tau_s", u.churn_tau_s)):
        if value is not None and value < 0:
            raise ValueError(f"{name} is {value}; it cannot be negative")
    if u.seq > _MAX_SEQ or u.epoch > _MAX_SEQ:
        raise ValueError(f"seq {u.seq} or epoch {u.epoch} is beyond 2**63 - 1")
    if not 0.0 <= u.kv_usage <= 1.0:
        raise ValueError(f"kv_usage is {u.kv_usage}; a fraction in [0, 1] is expected")
    if u.prefill_tokens_per_s is not None and u.prefill_tokens_per_s <= 0:
        raise ValueError(f"prefill_tokens_per_s is {u.prefill_tokens_per_s}; > 0 or absent is expected")
    _check_accepted(u.accepted)


def _check_accepted(accepted: dict[str, int]) -> None:
    if len(accepted) > MAX_ROUTER_IDS:
        raise ValueError(f"accepted names {len(accepted)} routers; at most {MAX_ROUTER_IDS} are kept")
    for router_id, number in accepted.items():
        if not 0 <= number <= MAX_BOOKING or len(router_id) > MAX_ROUTER_ID_CHARS:
            raise ValueError(f"accepted[{router_id[:MAX_ROUTER_ID_CHARS]!r}] = {number}; a booking number in "
                             f"[0, {MAX_BOOKING}] under an id of at most {MAX_ROUTER_ID_CHARS} characters is expected")
