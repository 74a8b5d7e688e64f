"""What a replica that has not measured a rate yet is priced with: the slowest rate the other candidates measured.

A replica reports its rates in ``/load`` once it measured them (its prefill rate after its first prefill step, its
decode step time after its first decode steps, its pull rate after its first pull...). Until then the router
prices it as the slowest candidate that did (a conservative prior learned from the fleet, never 0). A rate no
replica measured yet is None: the estimate leaves that part unpriced (``estimate.TTFTEstimate.priced``), except
the pull's, which starts from the router's own priors (``PullPriors``, from
``KVPlacementRules.peer_pull_assumed_bytes_per_s`` and ``peer_pull_overhead_s``) until a replica measured one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost.measured import decode_coefficients, s_per_unit

_INF = math.inf


@dataclass(frozen=True, slots=True)
class FleetRates:
    """The slowest measured rate of each kind over the candidates (None: none measured)."""

    prefill_s_per_token: float | None = None
    """Seconds per prompt token computed."""
    decode_step: tuple[float, float, float] | None = None
    """(step_s, s_per_seq, s_per_context_token), each the largest reported."""
    h2d_s_per_byte: float | None = None
    """Seconds per byte loaded back from a host tier."""
    pull_s_per_byte: float | None = None
    """Seconds per byte pulled from a peer."""
    pull_fixed_s: float | None = None
    """Seconds one pull costs besides its bytes."""
    lora_s_per_byte: float | None = None
    """Seconds per byte of an adapter loaded into a slot."""
    kv_block_bytes: int | None = None
    """Bytes of one KV block (the largest reported)."""

    @classmethod
    def of(cls, loads: Iterable[ReplicaLoad]) -> FleetRates:
        """The slowest of ``loads``, each rate taken only where it counts as measured (measured.py)."""
        prefill = decode = h2d = pull = fixed = lora = block = None
        for load in loads:  # per request: measured.py's rule (0 < rate < inf) inlined for the three every load has
            if (r := load.prefill_tokens_per_s) and 0.0 < r < _INF and (prefill is None or 1.0 / r > prefill):
                prefill = 1.0 / r
            if (r := load.h2d_bytes_per_s) and 0.0 < r < _INF and (h2d is None or 1.0 / r > h2d):
                h2d = 1.0 / r
            if (r := load.pull_bytes_per_s) and 0.0 < r < _INF and (pull is None or 1.0 / r > pull):
                pull = 1.0 / r
            if load.lora is not None:
                lora = _slowest(lora, load.lora.load_bytes_per_s)
            if (f := load.pull_fixed_s) is not None and 0.0 <= f < _INF and (fixed is None or f > fixed):
                fixed = f
            if load.kv_block_bytes:
                block = load.kv_block_bytes if block is None else max(block, load.kv_block_bytes)
            if load.decode_step is not None and (coef := decode_coefficients(load.decode_step)) is not None:
                decode = coef if decode is None else (
                    max(decode[0], coef[0]), max(decode[1], coef[1]), max(decode[2], coef[2]))
        return cls(prefill, decode, h2d, pull, fixed, lora, block)


def _slowest(s_per_unit_so_far: float | None, rate: float | None) -> float | None:
    """The larger of ``s_per_unit_so_far`` and ``1 / rate`` (a rate that is not measured, measured.py: the first)."""
    s = s_per_unit(rate)
    if s != s:
        return s_per_unit_so_far
    return s if s_per_unit_so_far is None or s > s_per_unit_so_far else s_per_unit_so_far


@dataclass(frozen=True, slots=True)
class PullPriors:
    """Whether the router may plan pulls, and its priors for a fleet that has measured none."""

    enabled: bool = True
    """Peer pulls on (``KVPlacementRules.peer_pulls``)."""
    bytes_per_s: float | None = None
    """Pull bandwidth assumed before any replica measured one (None: no pull until one did)."""
    overhead_s: float = 0.0
    """Seconds a pull costs besides its bytes, before any replica measured it."""
