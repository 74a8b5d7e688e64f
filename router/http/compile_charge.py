"""A request's grammar compile seconds, charged to its tenant's fair share.

The replica says how long its compile processes worked for the request (its response header
``x-kvmesh-grammar-compile-s``: replica/server/compile_seconds.py). Fair share counts weighted tokens
(router/admission/fair_share.py), so the seconds become the prompt tokens that replica would have computed in them:
seconds x its measured prefill rate (``/load``'s ``prefill_tokens_per_s``; one that has not measured it yet is priced
at the slowest rate another replica measured, as the router prices requests: docs/overload.md), each weighted as a
computed prompt token. No replica measured yet: nothing is charged (no rate to price the seconds by).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from kvmesh.replica.openai.compile_tenant import COMPILE_SECONDS_HEADER
from kvmesh.router.routing.cost.fleet import FleetRates

if TYPE_CHECKING:
    from kvmesh.router.replicas.replica import Replica

MAX_COMPILE_S = 3600.0
"""A larger value is read as this (a replica's compile timeout is far shorter; a bound on one answer's charge)."""


def compile_tokens(headers: Mapping[str, str], replica: Replica, fleet: Iterable[Replica]) -> float:
    """The prompt tokens a response's compile seconds are worth on ``replica`` (0.0: none reported, or no rate);
    ``fleet``: the router's replicas, whose slowest measured rate prices one that has not measured its own."""
    value = headers.get(COMPILE_SECONDS_HEADER)
    if value is None or len(value) > 32:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        return 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        return 0.0
    rate = replica.load.prefill_tokens_per_s
    if not rate:
        s_per_token = FleetRates.of([r.load for r in fleet]).prefill_s_per_token
        rate = 1.0 / s_per_token if s_per_token else None
    return min(seconds, MAX_COMPILE_S) * rate if rate else 0.0
