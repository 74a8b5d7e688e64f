"""``GET /load``: the replica's load report, one msgspec Struct read by the router, the CLI and the simulator."""

from __future__ import annotations

import time
from typing import Annotated

import msgspec

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[\x20-\x7e]+$")]
_Word = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.,:-]+$")]
_Digest = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[0-9a-f]*$")]
_Count = Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]


class KVLayoutInfo(msgspec.Struct, frozen=True, kw_only=True):
    """``/load``'s ``kv_transfer.layout``: what a peer's blocks must match for this replica to read them (the
    fields its transfer handshake compares, replica/kv_transfer/agent.py), so a router pairs only replicas whose KV
    can move between them. Block hashes do not depend on these: equal hashes on two layouts are not shareable."""

    model: _Name
    """The served model name (another model's KV means nothing here)."""
    dtype: _Word
    """The cache's element type, torch's name: ``bfloat16``, ``float8_e4m3fn`` (``kv_cache_dtype``)."""
    block_size: _Count
    """Tokens per block."""
    scales_digest: _Digest = ""
    """The FP8 cache's per-layer k/v scales, digested (16 hex digits); empty for a cache in the model's dtype.
    Blocks quantized with other scales decode to other values."""
    cache_layout: _Word
    """The attention backend's cache shape with the block dimension named (``L,2,H,blocks,B,D``)."""
    tp_size: _Count = 1
    """Tensor-parallel ranks (a pull reads rank r from rank r)."""
    transport: _Word = "nixl"
    """The transfer agent's transport: ``nixl`` or ``local`` (the same process only)."""


class KVTransferLoad(msgspec.Struct, kw_only=True):
    """``/load``'s ``kv_transfer``: whether the replica moves KV and how fast, so a router can price a pull."""

    enabled: bool = False
    """The replica has a transfer agent and serves /kv/* and kv_transfer_params."""
    pull_bytes_per_s: float | None = None
    """Bytes per second of its finished pulls (EWMA, measured); None before the first one."""
    bytes_per_token: int | None = None
    """KV bytes one token takes on this replica (one block's bytes / block size); None when disabled."""
    registered_peers: int | None = None
    """Peers a router registered here (``POST /kv/peers``; 0 after a restart: the router registers them again);
    None when disabled."""
    pull_fixed_s: float | None = None
    """Seconds one pull costs besides its bytes (lease, handshake, the read's start: the intercept of its pulls'
    seconds fitted against their bytes, measured); None until pulls of different sizes told it."""
    layout: KVLayoutInfo | None = None
    """What a peer's KV must match to move to or from this replica; None when disabled. A router pairs no replica
    whose layout is missing or malformed."""


class DecodeStepLoad(msgspec.Struct, kw_only=True):
    """``/load``'s ``decode_step``: the replica's decode step time as measured on its own recent decode steps,
    ``step_s = step_s + s_per_seq * batch + s_per_context_token * context_tokens`` (replica/engine/step_time.py),
    and the batch it decodes now, so a router prices the steps a request waits through and its decode pace."""

    step_s: float | None = None
    """Seconds of a decode step besides its sequences (weights read, launches, sampling); None: not measured yet."""
    s_per_seq: float | None = None
    """Seconds each decoding sequence adds to a step."""
    s_per_context_token: float | None = None
    """Seconds each context token of a decoding sequence adds to a step (the KV it reads)."""
    num_steps: int = 0
    """Decode steps measured so far."""
    context_tokens: int = 0
    """Context tokens (prompt + output so far) of the requests running now, summed."""


class LoRALoad(msgspec.Struct, kw_only=True):
    """``/load``'s ``lora``: which LoRA adapters the replica can serve and what loading one costs there."""

    enabled: bool = False
    """The engine serves LoRA adapters (``--enable-lora``)."""
    max_loras: int = 0
    """Adapters one step may batch (device slots)."""
    max_lora_rank: int = 0
    """Largest adapter rank the replica accepts."""
    adapters: dict[str, int] = msgspec.field(default_factory=dict)
    """Every adapter the replica knows (``--lora-modules`` or ``/v1/load_lora_adapter``) -> its weights' bytes."""
    identities: dict[str, str] = msgspec.field(default_factory=dict)
    """Every adapter it knows -> the identity of the weights it read (``LoRARequest.identity``): a router keys an
    adapter's requests with it, as the replica keys the adapter's blocks."""
    resident: list[str] = msgspec.field(default_factory=list)
    """Adapters in a device slot now: a request for one needs no load."""
    active: list[str] = msgspec.field(default_factory=list)
    """Adapters with a running request: the slots ``max_loras`` has left are ``max_loras - len(active)``."""
    load_bytes_per_s: float | None = None
    """Bytes per second of the replica's adapter loads into a slot (measured); None before the first."""


class EmulationLoad(msgspec.Struct, kw_only=True):
    """``/load``'s ``emulation``: an emulated replica's profile and how well its steps kept to it
    (replica/emulate/timing.py)."""

    profile: str
    """The timing profile the steps wait out (``--emulate``)."""
    time_dilation: float = 1.0
    """Every step's profile seconds are multiplied by it."""
    num_steps: int = 0
    """Steps run so far."""
    busy_s: float = 0.0
    """Planned seconds of those steps (the emulated device's busy time)."""
    cpu_s_per_step: float | None = None
    """The engine thread's CPU seconds per step, its waits excluded (None before two steps)."""
    late_s_p50: float | None = None
    """Median lateness of a step's end (actual minus planned) over the last steps; None before a step."""
    late_s_p99: float | None = None
    """99th percentile of that lateness."""


class LoadReport(msgspec.Struct, kw_only=True):
    """What a router needs to weigh a replica (cheap to compute, polled often)."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    """Fraction of KV blocks in use by requests, 0..1 (cached-but-free blocks do not count)."""
    num_waiting_prefill_tokens: int
    """Prompt tokens not yet computed, summed over waiting and running requests."""
    num_kv_blocks: int = 0
    block_size: int = 0
    max_num_seqs: int | None = None
    """Most requests the replica runs at once (its scheduler's ``max_num_seqs``; KV may allow fewer); None: not said.
    Router admission sends no more than this at once (router/admission/room.py)."""
    scheduling_policy: str | None = None
    """The engine's scheduling policy, ``fcfs`` or ``priority`` (``--scheduling-policy``); None: not said. A router
    writes the priority it granted into requests only to a replica under ``priority`` (vLLM refuses one under fcfs)."""
    timestamp: float = msgspec.field(default_factory=time.time)
    """The replica's clock (``time.time()``) when it answered: routers estimate the clock offset from it."""
    kv_events_seq: int | None = None
    """Seq of the last KV event batch the replica's publisher sent (-1: none yet); None without events.
    A router that has not applied it soon after is not following the stream (router/control/stream_watch.py)."""
    num_grammar_compiles: int = 0
    """Requests whose structured-output grammar is compiling now: work no other field shows, which a router counts
    as the replica's progress (a slow compile is the request's, router/control/passive_health.py)."""
    kv_events_unsent_s: float | None = None
    """Seconds the oldest KV event batch has waited in the publisher unsent (0: none); None without events."""
    prefill_tokens_per_s: float | None = None
    """Prompt tokens per second the engine computes, measured on its own recent steps (None: not yet)."""
    kv_block_bytes: int | None = None
    """Bytes of one KV block (all layers, K and V, this rank): what a load-back of one block moves."""
    h2d_bytes_per_s: float | None = None
    """Host-to-device bandwidth the replica measured for its host tier; None without a tier."""
    num_host_kv_blocks: int = 0
    """Blocks of the host-memory tier (0: none)."""
    host_kv_cache_usage: float = 0.0
    """Fraction of the host tier's blocks holding content, 0..1."""
    kv_transfer: KVTransferLoad = msgspec.field(default_factory=KVTransferLoad)
    """KV transfer between replicas: enabled, measured pull rate, bytes per token."""
    lora: LoRALoad = msgspec.field(default_factory=LoRALoad)
    """LoRA adapters: which the replica knows, which are resident, what a load costs."""
    decode_step: DecodeStepLoad = msgspec.field(default_factory=DecodeStepLoad)
    """The measured decode step time: the router's price of a request's queue and decode pace."""
    emulation: EmulationLoad | None = None
    """An emulated replica's timing (``--emulate``); None: a real model runs."""

    def to_dict(self) -> dict:
        """The JSON object ``/load`` answers with."""
        return msgspec.to_builtins(self)
