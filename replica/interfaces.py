"""The runner's seam, written down: what ``LLMEngine`` drives, and where it sends KV events.

    AsyncLLM ─▶ LLMEngine ──ModelRunnerInterface──▶ ModelRunner (TP=1)
                    │                              | RayTPExecutor (TP>1)
                    │                              | FakeModelRunner (tests)
                    └──EventPublisher──▶ ZmqEventPublisher (KV events)

The HTTP server's seam, ``EngineClient``, is the engine's (engine/protocol.py). The seams are
``runtime_checkable``; tests/replica/test_interfaces.py checks every implementation.
Torch-free: importing this module loads no model code. It sits below the engine and the worker: it names
the step contract (step/) only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from kvmesh.events.schema import KVEvent
    from kvmesh.replica.kv_layout import KVBlockLayout
    from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
    from kvmesh.replica.step.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
    from kvmesh.replica.step.scheduler_output import SchedulerOutput


class KVOffloadCounters(Protocol):
    """What the engine reads of the host tier's copies (worker/kv_offload.py's ``KVOffloader``)."""

    block_bytes: int
    """Bytes of one KV block (all layers)."""
    h2d_bytes_per_s: float
    """Host-to-device bandwidth measured at start."""
    bytes_stored: int
    """Bytes copied to the host tier so far."""
    bytes_loaded: int
    """Bytes loaded back from the host tier so far."""
    load_seconds: float
    """Seconds spent loading back."""


@runtime_checkable
class ModelRunnerInterface(Protocol):
    """Runs the scheduler's steps on a model (or a stand-in) over a paged KV cache."""

    num_kv_blocks: int
    """KV cache blocks this runner holds (block 0 is the null block)."""
    max_model_len: int
    """Longest sequence (prompt + output) the model takes."""
    vocab_size: int
    """Token ids are in ``[0, vocab_size)``."""
    eos_token_ids: list[int]
    """Token ids that end a request (unless ``ignore_eos``)."""
    dead_reason: str | None
    """None while steps can run; otherwise why not (a TP rank died). Cheap to read."""
    device: torch.device | str
    """Where the model runs (rank 0's device under TP): ``cpu``, ``cuda:0``."""
    num_host_blocks: int
    """Blocks of the host-memory KV tier the runner holds (0: none; block 0 mirrors the null block)."""
    kv_offload: KVOffloadCounters | None
    """The host tier's copies (bytes moved, measured bandwidth); None without a tier."""
    kv_layout: KVBlockLayout | None
    """Where each KV block lies (rank 0's under TP: per-layer K/V regions, dtype, bytes per block), computed once
    when the cache is allocated; the host tier, the KV transfer agent and ``/load`` read it. None: no tensors
    (a stand-in runner)."""

    def bind_thread(self) -> None:
        """Make the calling thread the one that steps (its device current, CUDA graphs captured there); the
        engine thread calls it before its first step."""
        ...

    def finished_offload_stores(self) -> list[int]:
        """Steps whose copies to the host tier landed since the last call (never blocks; [] without a tier)."""
        ...

    def execute_model(self, out: SchedulerOutput) -> dict[str, int] | ModelRunnerOutput:
        """Runs one step; returns ``{request_id: sampled token}``, a ``ModelRunnerOutput`` (the same dict with
        the logprobs) when a request asked for logprobs."""
        ...

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        """Probes the runner (pings the TP ranks); returns ``dead_reason``."""
        ...

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Reads and checks a LoRA adapter into host memory (every rank); returns its bytes and the identity of
        its weights. Raises ValueError saying why one cannot be served (LoRA off, bad directory, rank above
        max_lora_rank, unknown targets, non-finite weights or scale)."""
        ...

    def remove_lora(self, lora: LoRARequest) -> bool:
        """Forgets one version of an adapter (``lora``: the registered copy, with its identity): its host memory
        and device slot; False when the runner held neither. The engine calls it once no request runs with it."""
        ...

    def lora_residency(self) -> tuple[list[str], float | None]:
        """Adapters in a device slot now, and the measured bytes per second of loads into a slot (None before
        the first); ``([], None)`` without LoRA. Read from any thread (a racy snapshot)."""
        ...

    def lora_load_seconds(self) -> float:
        """Seconds spent so far writing adapters into device slots (0.0 without LoRA, or where a step's loads are not
        known in this process). The engine leaves them out of its step times: a load is priced apart."""
        ...

    def shutdown(self) -> None:
        """Releases what the runner holds (worker actors, placement group)."""
        ...


@runtime_checkable
class AsyncModelRunner(ModelRunnerInterface, Protocol):
    """A runner that launches a step without waiting for its tokens (async scheduling, async_scheduling.py)."""

    def execute_model_async(self, out: SchedulerOutput) -> AsyncModelRunnerOutput:
        """Enqueues one step; its ``get()`` returns what ``execute_model`` would have."""
        ...


class EventPublisher(Protocol):
    """Where the engine sends each step's KV events (``ZmqEventPublisher``; a recorder in tests)."""

    def publish(self, events: list[KVEvent]) -> None:
        """Sends one step's events as one batch."""
        ...

    def close(self) -> None:
        """Flushes and releases the sockets."""
        ...


@runtime_checkable
class StreamPublisher(EventPublisher, Protocol):
    """A publisher of a sequenced stream (``ZmqEventPublisher``): what a replica's ``/load`` reports of it."""

    @property
    def seq(self) -> int:
        """The seq the next sent batch will carry (= batches sent so far)."""
        ...

    def unsent_s(self) -> float:
        """Seconds the oldest batch not yet sent has waited (0 when none waits)."""
        ...
