"""What a replica that has not measured a rate yet is priced with: the slowest rate the other candidates measured.

A replica reports its rates in ``/load`` once it measured them (its prefill rate after its first prefill step, its
decode step time after its first decode steps, its pull rate after its first pull...). Until then the router
prices it as the slowest candidate that did (a conservative prior learned from the fleet, never 0). A rate no
replica measured yet is None: the estimate leaves that part unpriced (``estimate.TTFTEstimate.priced``), except
the pull's, which starts from the router's own priors (``KVPlacementRules.peer_pull_assumed_bytes_per_s``,
``peer_pull_overhead_s``) until a replica measured one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvmesh.router.replicas.load import ReplicaLoad


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
        prefill = decode = h2d = pull = fixed = lora = block = None
        for load in loads:  # _slowest inlined for the three rates every load has (a decision reads this per request)
            if (rate := load.prefill_tokens_per_s) and not rate <= 0 and (prefill is None or 1.0 / rate > prefill):
                prefill = 1.0 / rate
            if (rate := load.h2d_bytes_per_s) and not rate <= 0 and (h2d is None or 1.0 / rate > h2d):
                h2d = 1.0 / rate
            if (rate := load.pull_bytes_per_s) and not rate <= 0 and (pull is None or 1.0 / rate > pull):
                pull = 1.0 / rate
            if load.lora is not None:
                lora = _slowest(lora, load.lora.load_bytes_per_s)
            if load.pull_fixed_s is not None:
                fixed = load.pull_fixed_s if fixed is None else max(fixed, load.pull_fixed_s)
            if load.kv_block_bytes:
                block = load.kv_block_bytes if block is None else max(block, load.kv_block_bytes)
            step = load.decode_step
            if step is not None and step.step_s is not None:
                coef = (step.step_s, step.s_per_seq or 0.0, step.s_per_context_token or 0.0)
                decode = coef if decode is None else (
                    max(decode[0], coef[0]), max(decode[1], coef[1]), max(decode[2], coef[2]))
        return cls(prefill, decode, h2d, pull, fixed, lora, block)


def _slowest(s_per_unit: float | None, rate: float | None) -> float | None:
    """The larger of ``s_per_unit`` and ``1 / rate`` (a rate of None or <= 0 is not a measurement)."""
    if not rate or rate <= 0:
        return s_per_unit
    s = 1.0 / rate
    return s if s_per_unit is None or s > s_per_unit else s_per_unit
