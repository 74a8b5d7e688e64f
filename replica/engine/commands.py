"""What a caller hands ``AsyncLLM``'s engine thread: one class per command, drained before every step.

Frozen slotted dataclasses, not msgspec Structs: a command never leaves the process (it crosses one thread,
through a ``queue.SimpleQueue``), and ``AddRequest`` carries a ``concurrent.futures.Future``, which has no wire form.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass

from kvmesh.replica.serving.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request (``LLMEngine.add_request``); ``accepted`` resolves once it is queued or refused."""

    request_id: str
    """The engine's id of the request (unique among unfinished ones)."""
    prompt_token_ids: list[int]
    """The prompt, as token ids."""
    sampling_params: SamplingParams | None
    """How to sample and stop (None: ``SamplingParams()``)."""
    cache_salt: str | None
    """Tenant isolation: requests with different salts share no cached blocks."""
    accepted: concurrent.futures.Future[None]
    """Set to None when the request is queued, or to the ValueError that refused it."""


@dataclass(frozen=True, slots=True)
class AbortRequests:
    """End requests now (``LLMEngine.abort_request``); unknown or finished ids are ignored."""

    request_ids: list[str]
    """The ids to abort."""


EngineCommand = AddRequest | AbortRequests
"""Every command the engine thread takes."""
