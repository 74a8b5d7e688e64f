"""The engine's face to the HTTP server (vLLM's ``vllm/engine/protocol.py``): ``EngineClient``, which ``AsyncLLM``
implements and the server calls.

    HTTP server ──EngineClient──▶ AsyncLLM ─▶ LLMEngine
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvmesh.replica.engine.engine_request import EngineRequest
    from kvmesh.replica.engine.stats import EngineStats
    from kvmesh.replica.serving.load_report import LoadReport
    from kvmesh.replica.serving.lora_request import LoRARequest
    from kvmesh.replica.serving.sampling_params import SamplingParams
    from kvmesh.replica.step.outputs import RequestOutput


@runtime_checkable
class EngineClient(Protocol):
    """What the replica's HTTP server needs of the engine (vLLM's ``EngineClient``)."""

    max_model_len: int
    block_size: int
    num_kv_blocks: int
    tensor_parallel_size: int
    draining: bool
    """Set by a graceful shutdown: new requests are refused (503)."""

    def generate(self, prompt: EngineRequest | list[int], sampling_params: SamplingParams | None = None,
                 request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Streams the request's ``RequestOutput``s (``prompt``: the whole request, engine_request.py, carried
        unchanged to the scheduler; or token ids sampled with ``sampling_params``); the first ``__anext__`` raises
        ValueError for bad input (a non-zero ``priority`` under the "fcfs" scheduling policy among it)."""
        ...

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Registers a LoRA adapter (read and checked now); False when registered already. Raises ValueError
        saying why an adapter cannot be served."""
        ...

    async def remove_lora(self, lora_name: str) -> bool:
        """Forgets a LoRA adapter; False when unknown."""
        ...

    async def reset_prefix_cache(self) -> int:
        """Stops caching every block no request holds (the whole cache, AllBlocksCleared, when none is held);
        how many blocks."""
        ...

    def list_loras(self) -> list[LoRARequest]:
        """The registered LoRA adapters."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def get_stats(self) -> EngineStats: ...

    def load_report(self) -> LoadReport:
        """The ``LoadReport`` routers poll (queue depth, KV usage, uncomputed prompt tokens)."""
        ...

    def dead_reason(self) -> str | None:
        """None while the replica can serve; otherwise why not."""
        ...
