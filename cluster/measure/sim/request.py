"""The simulated request: trace fields, the engine-facing request interface, and its timeline; the
trace records it is made from (``requests_from_mooncake``) and windows of a trace (``cut_trace``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvmesh.cluster.measure.workloads.generated import SessionRecord
from kvmesh.cluster.measure.workloads.traces import MooncakeRecord
from kvmesh.router.routing.receipts import RouteReceipt


@dataclass(slots=True, eq=False)
class SimRequest:
    """What ``KVCacheManager`` needs of a request (``request_id``, ``all_token_ids``,
    ``num_tokens``, ``num_computed_tokens``, ``cache_salt``, ``lora_name``) plus what the
    simulator measures. Token ids are filled on arrival and dropped on completion."""

    request_id: str
    arrival_s: float
    hash_ids: tuple[int, ...]
    num_prompt_tokens: int
    max_output_tokens: int
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_identity: str | None = None  # the simulator's adapters have no weights: keyed by name alone
    skip_reading_prefix_cache: bool = False
    session_id: str | None = None
    """The conversation this request belongs to (generated multi-turn workloads), if any."""
    model: str | None = None
    """The base model it names, when the workload has several (sim/lora.py ``ModelPools``)."""
    # -- measured --
    router_index: int = 0  # which of the simulated routers routed it
    booking: tuple[str, int] | None = None  # (router id, booking number) when its replica publishes its load
    receipt: RouteReceipt | None = None  # router/routing/receipts.py
    replica_id: str = ""  # its replica ("": not routed yet)
    predicted_hit_tokens: int = 0  # the router's match for the chosen replica, in tokens
    num_cached_tokens: int = 0  # prefix hit on admission: its pool's, or what a transfer brought (usage.cached_tokens)
    num_host_cached_tokens: int = 0  # the part of it loaded back from the host tier
    # -- KV moved to its replica (sim/transfer.py) --
    parent: SimRequest | None = None  # set on a prefill leg: the request whose prompt it computes
    prefill_leg: SimRequest | None = None  # set on a split request: the leg its prefill replica runs
    prefill_replica_id: str | None = None  # the prefill replica of a split request (None: not split)
    pull_from: str | None = None  # the holder the router asked its replica to pull the prefix from (None: none)
    pull_extent_tokens: int = 0  # leading prompt tokens its replica holds after the transfer
    num_transferred_tokens: int = 0  # the part of them moved from another replica (counted as cached)
    transfer_s: float = 0.0  # seconds the move took before the request joined its replica's queue
    prefill_computed_tokens: int = 0  # prompt tokens its prefill leg computed on the prefill replica
    num_output_tokens: int = 0
    admitted_s: float = -1.0
    first_token_s: float = -1.0
    finished_s: float = -1.0
    # -- tenants, priority, targets (workloads/tenants.py, sim/goodput.py) and the router's admission --
    tenant: str | None = None  # its tenant (None: one anonymous tenant)
    priority: int = 0  # vLLM's request priority: lower is served first
    ttft_target_s: float | None = None  # its targets (None: any); good = both met (goodput)
    itl_target_s: float | None = None  # mean inter-token time (TPOT)
    routed_s: float = -1.0  # when it was routed: its arrival, or later when it waited in the router's admission
    shed_reason: str | None = None  # refused by the router's admission (a 429 with this reason): never served

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def remaining_prefill(self) -> int:
        return self.num_prompt_tokens - self.num_computed_tokens

    @property
    def remaining_output(self) -> int:
        return self.max_output_tokens - self.num_output_tokens

    @property
    def own_cached_tokens(self) -> int:
        """Prompt tokens its replica's own pool held (the cached tokens less what a transfer brought)."""
        return self.num_cached_tokens - self.num_transferred_tokens

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt tokens some replica computed for it: its own replica, and its prefill leg's."""
        return self.num_prompt_tokens - self.num_cached_tokens + self.prefill_computed_tokens

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_output_tokens


def requests_from_mooncake(records: list[MooncakeRecord], time_scale: float = 1.0,
                           block_size: int = 512, trace_block_tokens: int = 512) -> list[SimRequest]:
    """One :class:`SimRequest` per trace record, arrivals scaled by ``time_scale``.

    With ``block_size != trace_block_tokens`` lengths are rescaled so that one hash id still
    maps to one block (``block_size`` tokens). Every request generates at least one token.
    """
    scale = block_size / trace_block_tokens
    out = []
    for i, r in enumerate(records):
        n = max(1, min(round(r.input_length * scale), len(r.hash_ids) * block_size))
        out.append(SimRequest(f"req-{i}", r.arrival_s * time_scale, r.hash_ids, n, max(1, r.output_length),
                              session_id=r.session_id if isinstance(r, SessionRecord) else None))
    return out


def cut_trace(records: list[MooncakeRecord], start: int = 0, count: int | None = None,
              max_prompt_blocks: int | None = None, trace_block_tokens: int = 512) -> list[MooncakeRecord]:
    """A window of a trace (``count`` records from ``start``), prompts truncated to at most
    ``max_prompt_blocks`` hash ids (a prefix of a chain is a chain: sharing is preserved).
    Arrival times are shifted so the window starts at 0."""
    window = records[start: None if count is None else start + count]
    if not window:
        raise ValueError(f"the trace has {len(records)} records; nothing from index {start}")
    t0 = window[0].timestamp_ms
    out = []
    for r in window:
        ids, n = r.hash_ids, r.input_length
        if max_prompt_blocks is not None and len(ids) > max_prompt_blocks:
            ids, n = ids[:max_prompt_blocks], max_prompt_blocks * trace_block_tokens
        out.append(replace(r, timestamp_ms=r.timestamp_ms - t0, input_length=n, hash_ids=ids))
    return out
