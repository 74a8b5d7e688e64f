"""One predicted time per candidate replica, in seconds: the request's time to first token there and its decode pace.

From what the replica measured of itself and reports in ``/load`` (router/routing/load.py), or, for a rate it has
not measured yet, the slowest the other candidates measured (fleet.py)::

    queue_s      = prefill_backlog * s_per_token              prompt tokens queued ahead, at its prefill rate
    interleave_s = steps * decode_step_s(batch, context)      the running batch's decode steps until our first token
                   steps = ceil((backlog + own) / step_tokens), at least 1 (0 with no batch)
    prefill_s    = own * s_per_token                           own = prompt - what it holds or pulls (an engine
                                                               computes at least the last token)
    load_back_s  = host blocks * block bytes * h2d s/byte      its host tier's part of the prefix, copied back
    pull_s       = pulled blocks * block bytes * pull s/byte + pull_fixed_s    (pull.py decides whether to pull)
    adapter_s    = adapter bytes * load s/byte                 the request's LoRA adapter, when not resident there
    ttft_s       = offset + scale * (sum of the above)        the replica's observed/predicted fit (correction.py)
    stall_s      = decoding requests * prefill_s               the delay its prefill puts on the decodes there
    pace_s       = decode_step_s(batch + 1, context + prompt)  seconds per output token once it decodes

``decode_step_s(b, c) = step_s + s_per_seq * b + s_per_context_token * c`` (the replica's fit,
replica/engine/step_time.py); before any replica measured one, a decode row is priced as one prompt token.
No weights: every term is seconds. A prefill rate nobody measured yet leaves the estimate unpriced
(``priced`` False: its parts are then in prompt-token units, so candidates still compare).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.router.replicas.load import ReplicaLoad
from kvmesh.router.routing.cost.correction import corrected
from kvmesh.router.routing.cost.fleet import FleetRates

MAX_HIT_FRACTION = 0.95
"""A replica's hit fraction counts up to this in the value of its cached tokens (``h / (1 - h)``, finite)."""


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
        return (self.queue_s + self.interleave_s + self.prefill_s + self.load_back_s + self.pull_s
                + self.adapter_s)

    @property
    def ttft_s(self) -> float:
        """The predicted time to first token."""
        return self.raw_s if self.corrected_s is None else self.corrected_s

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
        return self.ttft_s + self.stall_s + self.delay_s + self.evict_s


def prefill_s_per_token(load: ReplicaLoad, fleet: FleetRates) -> float | None:
    """Seconds per prompt token on this replica: its measured rate, else the fleet's slowest (None: unknown)."""
    rate = load.prefill_tokens_per_s
    return 1.0 / rate if rate and rate > 0 else fleet.prefill_s_per_token


def decode_step_s(load: ReplicaLoad, fleet: FleetRates, batch: int, context_tokens: float,
                  s_per_token: float) -> float:
    """Seconds of one decode step of ``batch`` sequences over ``context_tokens`` on this replica."""
    if batch <= 0:
        return 0.0
    step = load.decode_step
    coef = ((step.step_s, step.s_per_seq or 0.0, step.s_per_context_token or 0.0)
            if step is not None and step.step_s is not None else fleet.decode_step)
    if coef is None:
        return batch * s_per_token  # no step measured anywhere: a decode row costs one prompt token
    return coef[0] + coef[1] * batch + coef[2] * context_tokens


def block_bytes(load: ReplicaLoad, fleet: FleetRates, block_size: int) -> int | None:
    """Bytes one KV block of this replica moves (reported, from its bytes per token, or the fleet's)."""
    if load.kv_block_bytes:
        return load.kv_block_bytes
    if load.kv_bytes_per_token:
        return load.kv_bytes_per_token * block_size
    return fleet.kv_block_bytes


def load_back_s(load: ReplicaLoad, fleet: FleetRates, num_blocks: int, block_size: int,
                s_per_token: float) -> float:
    """Seconds to copy ``num_blocks`` back from the host tier (bandwidth unknown anywhere: as recomputing them)."""
    if not num_blocks:
        return 0.0
    nbytes = block_bytes(load, fleet, block_size)
    rate = load.h2d_bytes_per_s
    s_per_byte = 1.0 / rate if rate and rate > 0 else fleet.h2d_s_per_byte
    if nbytes is None or s_per_byte is None:
        return num_blocks * block_size * s_per_token
    return num_blocks * nbytes * s_per_byte


def adapter_s(load: ReplicaLoad, fleet: FleetRates, lora_name: str | None) -> float:
    """Seconds to load ``lora_name`` into a slot there: 0 when none is named or it is resident; its size over the
    measured load rate (the fleet's slowest, else the host tier's copy rate); 0 when its size is known nowhere."""
    lora = load.lora
    if lora_name is None or lora is None or lora_name in lora.resident:
        return 0.0
    size = lora.adapters.get(lora_name)
    if not size:
        return 0.0
    rate = lora.load_bytes_per_s
    s_per_byte = 1.0 / rate if rate and rate > 0 else fleet.lora_s_per_byte
    if s_per_byte is None:
        h2d = load.h2d_bytes_per_s
        s_per_byte = 1.0 / h2d if h2d and h2d > 0 else fleet.h2d_s_per_byte
    return size * s_per_byte if s_per_byte is not None else 0.0


def estimate(load: ReplicaLoad, fleet: FleetRates, prompt_tokens: int, own_tokens: int, host_blocks: int,
             block_size: int, step_tokens: float, pull_s: float = 0.0, pulled_blocks: int = 0,
             lora_name: str | None = None) -> TTFTEstimate:
    """The estimate on ``load``'s replica for a prompt of ``prompt_tokens`` of which it computes ``own_tokens``,
    loads ``host_blocks`` back from its host tier and pulls ``pulled_blocks`` in ``pull_s`` (pull.py)."""
    spt = prefill_s_per_token(load, fleet)
    priced = spt is not None
    if spt is None:
        spt = 1.0
    backlog, batch = load.prefill_backlog, load.decode_load
    step = load.decode_step
    context = step.context_tokens if step is not None and step.context_tokens else \
        batch * load.recent_prompt / load.recent_requests if load.recent_requests > 0 else 0
    steps = -(-(backlog + own_tokens) // step_tokens) if step_tokens > 0 else 1
    step_s = decode_step_s(load, fleet, batch, context, spt)
    prefill = own_tokens * spt
    queue, interleave = backlog * spt, max(steps, 1) * step_s if batch else 0.0
    load_back, adapter = load_back_s(load, fleet, host_blocks, block_size, spt), adapter_s(load, fleet, lora_name)
    ttft = corrected(load, queue + interleave + prefill + load_back + pull_s + adapter)  # TTFTEstimate.raw_s
    hit = 1.0 - load.recent_prefill / load.recent_prompt if load.recent_prompt > 0 else 0.0
    delay = load.arrival_rate * ttft * prefill if priced else 0.0  # unpriced: no time scale for the rate
    hit = min(hit, MAX_HIT_FRACTION)
    stored = own_tokens + (pulled_blocks + host_blocks) * block_size  # computed, pulled, loaded back: all evict
    return TTFTEstimate(  # built once (dataclasses.replace costs more than the arithmetic)
        queue_s=queue, interleave_s=interleave, prefill_s=prefill, load_back_s=load_back, pull_s=pull_s,
        adapter_s=adapter, stall_s=batch * prefill,
        pace_s=decode_step_s(load, fleet, batch + 1, context + prompt_tokens, spt),
        evict_s=hit / (1 - hit) * stored * spt, delay_s=delay, corrected_s=ttft,
        priced=priced, own_tokens=own_tokens, pulled_blocks=pulled_blocks)
