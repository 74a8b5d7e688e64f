"""What a caller hands ``AsyncLLM``'s engine thread: one class per command, drained before every step.

Frozen slotted dataclasses, not msgspec Structs: a command never leaves the process (it crosses one thread,
through a ``queue.SimpleQueue``), and ``AddRequest`` carries a ``concurrent.futures.Future``, which has no wire form.

A caller may stop waiting at any await point (its client went away, ``asyncio.wait_for``, a server shutting down):
cancelling the awaited ``asyncio.wrap_future`` cancels the command's future too, and setting a cancelled future
raises. The engine thread therefore settles every answer through ``answer`` / ``refuse``, which never raise on a
settled future and tell it whether the caller will read the answer (so it can undo what nobody will use: abort the
request, release the lease).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kvmesh.replica.serving.lora_request import LoRARequest

if TYPE_CHECKING:  # named for type checkers only: the engine loads no transfer code until a pull is asked
    from kvmesh.replica.engine.engine_request import EngineRequest
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent
    from kvmesh.replica.kv_transfer.leases import Lease

T = TypeVar("T")


def answer(future: concurrent.futures.Future[T], value: T) -> bool:
    """Hand ``value`` to the caller waiting on ``future``; False (and nothing raised) when the caller gave up on it
    first (cancelled): nobody will read ``value``."""
    try:
        future.set_result(value)
    except concurrent.futures.InvalidStateError:
        return False
    return True


def refuse(future: concurrent.futures.Future, error: BaseException) -> bool:
    """Hand ``error`` to the caller waiting on ``future``; False when the caller gave up on it first."""
    try:
        future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        return False
    return True


def refused(future: concurrent.futures.Future) -> bool:
    """The engine refused what ``future`` waited for (set to an error, not cancelled)."""
    return future.done() and not future.cancelled() and future.exception() is not None


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request (``LLMEngine.add_request``); ``accepted`` resolves once it is queued or refused."""

    request: EngineRequest
    """The request, carried unchanged to ``LLMEngine.add_request``."""
    accepted: concurrent.futures.Future[None]
    """Set to None when the request is queued, or to the ValueError that refused it."""


@dataclass(frozen=True, slots=True)
class AbortRequests:
    """End requests now (``LLMEngine.abort_request``); unknown or finished ids are ignored."""

    request_ids: list[str]
    """The ids to abort."""


@dataclass(frozen=True, slots=True)
class PullPrefix:
    """Read a prompt's cached prefix from a peer replica into the prefix cache ahead of any request (tools and
    benchmarks; a request's own pull rides its ``kv_transfer_params``; kv_transfer/prefix_pull.py)."""

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
    """Set once the read ended (checked between steps: other requests keep stepping meanwhile) to the tokens
    pulled (0: nothing missing, no room, or the read failed or timed out)."""
    remote_block_media: list[str] | None = None
    """The holder's tier of each block (``"GPU"``/``"CPU"``: its host tier); None: every block on its device."""
    lora_name: str | None = None
    """The LoRA adapter the prompt runs with (it keys the block hashes, as the holder's); None: the base model."""
    lora_identity: str | None = None
    """The identity of that adapter's weights here (it keys the hashes after the name)."""


@dataclass(frozen=True, slots=True)
class LeaseBlocks:
    """Hold a prompt's cached leading blocks for a peer to read, or show the lease a P/D handle named
    (kv_transfer/leases.py). The hashes are computed before the command is sent: the engine thread only looks
    them up."""

    block_hashes: list[bytes]
    """The prompt's full blocks' hashes (its token ids and cache salt, hashed off the engine thread)."""
    ttl_s: float
    """Seconds until a new lease ends on its own."""
    peer: str
    """Who asks (its x-kvmesh-replica-id, else its address): the per-peer cap counts its leases."""
    granted: concurrent.futures.Future[Lease]
    """Set to the lease (no blocks and lease_id "": none of the prompt is cached), or to ``LeaseRefused``."""
    lease_id: str | None = None
    """Show this existing lease instead (only when it holds a leading run of ``block_hashes``)."""


@dataclass(frozen=True, slots=True)
class ReleaseLease:
    """Let a lease's blocks go (the peer read them, or gave up)."""

    lease_id: str
    """The lease's handle."""
    released: concurrent.futures.Future[int | None]
    """Set to the blocks it held, or None when no such lease is live (unknown, released or expired)."""


@dataclass(frozen=True, slots=True)
class AddLoRA:
    """Register a LoRA adapter (``LLMEngine.add_lora``): read and checked on the engine thread."""

    lora_request: LoRARequest
    """The adapter."""
    done: concurrent.futures.Future[bool]
    """Set to ``add_lora``'s answer (False: registered already), or to the ValueError that refused it."""


@dataclass(frozen=True, slots=True)
class RemoveLoRA:
    """Forget a LoRA adapter (``LLMEngine.remove_lora``)."""

    lora_name: str
    """The adapter's name."""
    done: concurrent.futures.Future[bool]
    """Set to ``remove_lora``'s answer (False: unknown)."""


@dataclass(frozen=True, slots=True)
class ResetPrefixCache:
    """Stop caching every block no request holds (``LLMEngine.reset_unreferenced``)."""

    done: concurrent.futures.Future[int]
    """Set to how many blocks stopped being cached."""


EngineCommand = (AddRequest | AbortRequests | PullPrefix | LeaseBlocks | ReleaseLease | AddLoRA | RemoveLoRA
                 | ResetPrefixCache)
"""Every command the engine thread takes."""
KV_COMMANDS = (PullPrefix, LeaseBlocks, ReleaseLease)
"""The commands the KV transfer connector carries out (``EngineKVTransfers.handle``, kv_transfers.py)."""
