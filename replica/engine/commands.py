"""What a caller hands ``AsyncLLM``'s engine thread: one class per command, drained before every step.

Frozen slotted dataclasses, not msgspec Structs: a command never leaves the process (it crosses one thread,
through a ``queue.SimpleQueue``), and ``AddRequest`` carries a ``concurrent.futures.Future``, which has no wire form.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.replica.serving.sampling_params import SamplingParams

if TYPE_CHECKING:  # named for type checkers only: the engine loads no transfer code until a pull is asked
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent


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


@dataclass(frozen=True, slots=True)
class PullPrefix:
    """Read a prompt's cached prefix from a peer replica into the prefix cache (kv_transfer/prefix_pull.py)."""

    agent: KVTransferAgent
    """This replica's transfer agent, with ``peer`` added."""
    peer: str
    """The holder's agent name."""
    prompt_token_ids: list[int]
    """The prompt whose leading full blocks are pulled."""
    remote_block_ids: list[int]
    """The holder's block ids of those blocks, in order (its ``cached_prefix_block_ids``)."""
    cache_salt: str | None
    """The prompt's salt (it changes the block hashes)."""
    pulled: concurrent.futures.Future[int]
    """Set to the tokens pulled (0: nothing missing, no room, or the read failed)."""


EngineCommand = AddRequest | AbortRequests | PullPrefix
"""Every command the engine thread takes."""
