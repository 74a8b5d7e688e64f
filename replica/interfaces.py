"""The replica's two seams, written down: what ``LLMEngine`` drives and what the HTTP server calls.

    HTTP server ──EngineClient──▶ AsyncLLM ─▶ LLMEngine ──ModelRunnerInterface──▶ ModelRunner (TP=1)
                                                   │                              | RayTPExecutor (TP>1)
                                                   │                              | FakeModelRunner (tests)
                                                   └──EventPublisher──▶ ZmqEventPublisher (KV events)

The two seams are ``runtime_checkable``; tests/replica/test_interfaces.py checks every implementation.
Torch-free: importing this module loads no model code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from kvmesh.events.schema import KVEvent
    from kvmesh.replica.engine.outputs import ModelRunnerOutput, RequestOutput
    from kvmesh.replica.engine.scheduler_output import SchedulerOutput
    from kvmesh.replica.engine.stats import EngineStats
    from kvmesh.replica.kv_layout import KVBlockLayout
    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.worker.async_output import AsyncModelRunnerOutput
    from kvmesh.replica.worker.kv_offload import KVOffloader


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
    kv_offload: KVOffloader | None
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


@runtime_checkable
class EngineClient(Protocol):
    """What the replica's HTTP server needs of the engine (vLLM's ``EngineClient``)."""

    max_model_len: int
    block_size: int
    num_kv_blocks: int
    tensor_parallel_size: int
    draining: bool
    """Set by a graceful shutdown: new requests are refused (503)."""

    def generate(self, prompt_token_ids: list[int], sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Streams the request's ``RequestOutput``s; the first ``__anext__`` raises ValueError for bad input."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def get_stats(self) -> EngineStats: ...

    def load_report(self) -> LoadReport:
        """The ``LoadReport`` routers poll (queue depth, KV usage, uncomputed prompt tokens)."""
        ...

    def dead_reason(self) -> str | None:
        """None while the replica can serve; otherwise why not."""
        ...
