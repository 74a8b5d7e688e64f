"""One engine request as its caller hands it over (vLLM's ``EngineCoreRequest``): built once per candidate by the
OpenAI layer (or by ``LLM``), then carried unchanged down to the scheduler's ``Request``, which holds it.

    completions.py ─EngineRequest─▶ parallel_sampling.start_all ─▶ AsyncLLM.generate ─AddRequest─▶ engine thread
        ─▶ LLMEngine.add_request ─▶ Request(engine_request) ─▶ Scheduler

A per-request option is one field here: every layer passes the struct, none names its fields. The scheduler's
``Request`` reads what it needs of it once (``request.engine_request`` keeps the whole of it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine loads no transfer code until a request asks for a pull or a lease
    from kvmesh.replica.engine.remote_kv import RemoteKV


class EngineRequest(msgspec.Struct, frozen=True):
    """A request for the engine. A frozen msgspec Struct (vLLM's ``EngineCoreRequest`` is one): cheap to build and
    never changed on its way; it stays in the process (its LoRA adapter and remote KV hold live objects)."""

    request_id: str
    """The engine's id of the request (unique among unfinished ones)."""
    prompt_token_ids: list[int]
    """The prompt, as token ids."""
    sampling_params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    """How to sample and stop."""
    cache_salt: str | None = None
    """Tenant isolation: requests with different salts share no cached blocks."""
    arrival_time: float | None = None
    """When it arrived (``time.monotonic()``); None: when the engine queues it."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter it runs with, registered on first use (None: the base model)."""
    priority: int = 0
    """Lower runs first under the "priority" scheduling policy (vLLM's request ``priority``); non-zero is refused
    under "fcfs"."""
    remote_kv: RemoteKV | None = None
    """Its ``kv_transfer_params``: a pull before it runs, a lease at its finish (engine/remote_kv.py)."""
