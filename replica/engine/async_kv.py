"""``AsyncLLM``'s KV transfer commands: pulls, leases and releases, each run on the engine thread.

    pull_prefix(agent, peer, prompt, ids)     a peer's blocks read into this cache between steps (PullPrefix)
    lease_blocks(prompt, salt, ttl_s, peer)   the prompt's cached blocks held for a peer (LeaseBlocks; hashed here,
                                              off the engine thread)
    lease_at_finish(request_id, ttl_s, peer)  the P/D prefill side's lease, taken as its request finishes
    release_lease(lease_id)                   the blocks let go

A mixin of ``AsyncLLM`` (engine/async_llm.py), which owns the command queue (``_ask``, ``_submit``) and the
engine; ``EngineKVTransfers`` (engine/kv_transfers.py) carries the commands out on the engine thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING

from kvmesh.replica.engine.commands import EngineCommand, LeaseAtFinish, LeaseBlocks, PullPrefix, ReleaseLease
from kvmesh.replica.kv_transfer.prefix_pull import block_hasher

if TYPE_CHECKING:
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent
    from kvmesh.replica.kv_transfer.leases import Lease

KV_COMMANDS = (PullPrefix, LeaseBlocks, LeaseAtFinish, ReleaseLease)
"""The commands ``EngineKVTransfers.handle`` carries out on the engine thread."""


class AsyncKVCommands:
    """The KV transfer half of ``AsyncLLM``'s commands (see the module doc)."""

    if TYPE_CHECKING:  # what AsyncLLM provides
        engine: LLMEngine
        errored: BaseException | None
        is_running: bool

        def _submit(self, command: EngineCommand) -> None: ...

        async def _ask(self, command: EngineCommand, answer: concurrent.futures.Future): ...

    async def pull_prefix(self, agent: KVTransferAgent, peer: str, prompt_token_ids: list[int],
                          remote_block_ids: list[int], cache_salt: str | None = None,
                          remote_block_media: list[str] | None = None, lora_name: str | None = None,
                          lora_identity: str | None = None) -> int:
        """Pull the prompt's cached prefix from ``peer`` (its ``remote_block_ids``) into this engine's prefix cache;
        the tokens pulled. A request added afterwards hits them (``num_cached_tokens``). The read is started
        between two steps and polled between the next ones: other requests keep stepping while it is in flight."""
        pulled: concurrent.futures.Future[int] = concurrent.futures.Future()
        return await self._ask(PullPrefix(agent, peer, prompt_token_ids, remote_block_ids, cache_salt, pulled,
                                          remote_block_media, lora_name, lora_identity), pulled)

    async def lease_blocks(self, prompt_token_ids: list[int], cache_salt: str | None, ttl_s: float,
                           peer: str = "local", lease_id: str | None = None, lora_name: str | None = None,
                           lora_identity: str | None = None) -> Lease:
        """Hold the prompt's cached leading blocks for ``peer`` to read, or (``lease_id``) show that lease when it
        holds this prompt's chain (kv_transfer/leases.py; ``LeaseRefused`` otherwise or past a cap). The prompt is
        hashed on a worker thread: the engine thread only looks the hashes up."""
        hashes = await asyncio.to_thread(self.block_hashes, prompt_token_ids, cache_salt, lora_name, lora_identity)
        granted: concurrent.futures.Future[Lease] = concurrent.futures.Future()
        return await self._ask(LeaseBlocks(hashes, ttl_s, peer, granted, lease_id), granted)

    def block_hashes(self, prompt_token_ids: list[int], cache_salt: str | None,
                     lora_name: str | None = None, lora_identity: str | None = None) -> list[bytes]:
        """The hashes of the prompt's full blocks as this replica's prefix cache keys them (any thread: it reads
        only the cache's fixed block size and seed); ``lora_name``: the adapter it runs with, ``lora_identity``
        the identity of its weights (the asker's: blocks of other weights under that name never match)."""
        return block_hasher(self.engine.kv_cache_manager, prompt_token_ids, cache_salt, lora_name,
                            lora_identity).block_hashes

    def lease_at_finish(self, request_id: str, ttl_s: float, peer: str = "local") -> concurrent.futures.Future[Lease]:
        """Arm a lease on the prompt blocks of ``request_id`` (call before generating it), taken on the engine
        thread when it finishes, before its blocks are freed, counted against ``peer``'s cap; resolves to an empty
        lease if it was aborted, failed or refused, or a cap was reached."""
        if not self.is_running:
            raise RuntimeError(f"the engine is not running ({self.errored!r}); restart the replica")
        granted: concurrent.futures.Future[Lease] = concurrent.futures.Future()
        self._submit(LeaseAtFinish(request_id, ttl_s, peer, granted))
        return granted

    async def release_lease(self, lease_id: str) -> int | None:
        """Let a lease's blocks go; the blocks it held, or None when no such lease is live."""
        released: concurrent.futures.Future[int | None] = concurrent.futures.Future()
        return await self._ask(ReleaseLease(lease_id, released), released)
