"""One request's predicted time on one replica (``TTFTEstimate``), the price's terms (terms.py) evaluated on that
replica's floats: its time to first token there, by part, its decode pace, and what its prefill takes from the
other requests there.

From what the replica measured of itself and reports in ``/load`` (router/routing/load.py, read by measured.py),
or, for a rate it has not measured yet, the slowest the other candidates measured (fleet.py). No weights: every
term is seconds. A prefill rate nobody measured yet leaves the estimate unpriced (``priced`` False: its parts are
then in prompt-token units, so candidates still compare).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost import terms
from kvmesh.router.routing.cost.fleet import FleetRates
from kvmesh.router.routing.cost.measured import measured, s_per_unit
from kvmesh.router.routing.cost.ops import SCALAR


@dataclass(slots=True, unsafe_hash=True)
class TTFTEstimate:
    """A request's predicted time on one replica, by part (seconds; see the module doc). A value: built once, never
    changed (not frozen only because a frozen dataclass sets each field through ``object.__setattr__``, which made
    building one, once per candidate priced per request, cost twice as much; hashable as a frozen one is)."""

    queue_s: float
    interleave_s: float
    prefill_s: float
    load_back_s: float
    pull_s: float
    adapter_s: float
    stall_s: float
    """Seconds its prefill delays the decodes running there, summed over them (not part of ``ttft_s``)."""
    pace_s: float
    """Predicted seconds per output token once it decodes there."""
    evict_s: float = 0.0
    """Prefill seconds its stored tokens (computed, pulled or loaded back) take from later requests: they evict as
    many cached tokens there, and a token cached there brings ``h / (1 - h)`` hit tokens over its life (the
    replica's recent hit tokens per token it computed, ``h`` its hit fraction; not part of ``ttft_s``)."""
    delay_s: float = 0.0
    """Seconds its prefill delays the requests expected to arrive there before its first token (their arrival
    rate there times its TTFT, each delayed by its prefill; not part of ``ttft_s``)."""
    corrected_s: float | None = None
    """The sum of the parts through the replica's learned observed/predicted fit (correction.py); None: the raw sum."""
    priced: bool = True
    """Every rate was known (measured here or by another candidate); False: unit rates, compare only."""
    own_tokens: int = 0
    """Prompt tokens it computes there."""
    pulled_blocks: int = 0
    """Blocks it pulls from a peer there (0: none)."""

    @property
    def raw_s(self) -> float:
        """The sum of the parts before the correction."""
        return terms.raw_s(self.queue_s, self.interleave_s, self.prefill_s, self.load_back_s, self.pull_s,
                           self.adapter_s)

    @property
    def ttft_s(self) -> float:
        """The predicted time to first token."""
        return self.raw_s if self.corrected_s is None else self.corrected_s

    @property
    def own_s(self) -> float:
        """The part of ``raw_s`` that is its own work (prefill, load-back, pull, adapter load): what ``wait_s``
        leaves out, before the correction."""
        return self.prefill_s + self.load_back_s + self.pull_s + self.adapter_s

    @property
    def wait_s(self) -> float:
        """The part of ``ttft_s`` spent waiting for the work already there (queue and interleaved decodes), not on
        its own (prefill, load-back, pull, adapter load); corrected in proportion. Router admission gates on it: a
        long prompt's own prefill is no reason to hold it back."""
        raw = self.raw_s
        waiting = self.queue_s + self.interleave_s
        return waiting if raw <= 0 or self.corrected_s is None else waiting * self.corrected_s / raw

    @property
    def choice_s(self) -> float:
        """What ``cache_aware`` minimizes: its TTFT and the seconds its prefill takes from the other requests there
        (the decodes it stalls, the arrivals it delays, the cached tokens it evicts)."""
        return terms.choice_s(self.ttft_s, self.stall_s, self.delay_s, self.evict_s)


def prefill_s_per_token(load: ReplicaLoad, fleet: FleetRates) -> float | None:
    """Seconds per prompt token on this replica: its measured rate, else the fleet's slowest (None: unknown)."""
    spt = s_per_unit(load.prefill_tokens_per_s)
    return spt if spt == spt else fleet.prefill_s_per_token


def adapter_s(load: ReplicaLoad, fleet: FleetRates, lora_name: str | None) -> float:
    """Seconds to load ``lora_name`` into a slot there: 0 when none is named or it is resident; its size over the
    measured load rate (the fleet's slowest, else the host tier's copy rate); 0 when its size is known nowhere."""
    lora = load.lora
    if lora_name is None or lora is None or lora_name in lora.resident:
        return 0.0
    size = lora.adapters.get(lora_name)
    if not size:
        return 0.0
    s_per_byte = s_per_unit(lora.load_bytes_per_s)
    if s_per_byte != s_per_byte:
        s_per_byte = fleet.lora_s_per_byte
    if s_per_byte is None:
        s_per_byte = s_per_unit(load.h2d_bytes_per_s)
        if s_per_byte != s_per_byte:
            s_per_byte = fleet.h2d_s_per_byte
    return size * s_per_byte if s_per_byte is not None else 0.0


def estimate(load: ReplicaLoad, fleet: FleetRates, prompt_tokens: int, own_tokens: int, host_blocks: int,
             block_size: int, step_tokens: float, pull_s: float = 0.0, pulled_blocks: int = 0,
             lora_name: str | None = None) -> TTFTEstimate:
    """The estimate on ``load``'s replica for a prompt of ``prompt_tokens`` of which it computes ``own_tokens``,
    loads ``host_blocks`` back from its host tier and pulls ``pulled_blocks`` in ``pull_s`` (pull.py)."""
    r = terms.rates(measured(load), fleet, SCALAR)
    c = terms.CandidateWork(own_tokens, host_blocks or None, pulled_blocks, pull_s)
    return estimate_of(terms.price(r, fleet, c, adapter_s(load, fleet, lora_name), block_size, step_tokens, SCALAR),
                       r, c, prompt_tokens)


def estimate_of(parts: terms.Parts, r: terms.Rates, c: terms.CandidateWork, prompt_tokens: int) -> TTFTEstimate:
    """The ``TTFTEstimate`` of one replica's ``parts`` (floats; its pace priced now)."""
    return TTFTEstimate(  # built once, positionally (dataclasses.replace and keywords cost more than the arithmetic)
        parts.queue_s, parts.interleave_s, parts.prefill_s, parts.load_back_s or 0.0, parts.pull_s or 0.0,
        parts.adapter_s or 0.0, parts.stall_s, terms.pace_s(r, r.m.batch, r.m.context, prompt_tokens, SCALAR),
        parts.evict_s, parts.delay_s, parts.ttft_s, r.priced, c.computed, c.pulled or 0)
