"""``AsyncLLM``: the engine on a background thread behind the ``EngineClient`` interface.

    caller coroutines ──commands──▶ EngineThread (engine_thread.py): drain commands, step(), repeat
            ▲                                              │
            └── per-request asyncio.Queue ◀─ call_soon_threadsafe ┘

The engine itself is single-threaded; only the engine thread touches it. A generate() that is cancelled or closed
early aborts its request (a lease its final output carried, unread, is let go). A request that fails gets a final
output with finish_reason "error"; the others keep running. Besides streaming, it answers what the HTTP server and
routers ask (``load_report``, ``dead_reason``) and owns the engine's model runner (``shutdown`` stops both).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from kvmesh.kvcache.hashing import salt_secret_check, salt_secret_from_none_hash
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.build import build_engine
from kvmesh.replica.engine.commands import (
    AbortRequests,
    AddLoRA,
    AddRequest,
    EngineCommand,
    LeaseBlocks,
    PullPrefix,
    ReleaseLease,
    RemoveLoRA,
    ResetPrefixCache,
    refused,
)
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.engine_thread import EngineThread
from kvmesh.replica.engine.kv_transfers import EngineKVTransfers
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.engine.load_fields import load_report, read_racily
from kvmesh.replica.engine.stats import EngineStats
from kvmesh.replica.interfaces import ModelRunnerInterface
from kvmesh.replica.kv_transfer.prefix_pull import block_hasher
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.outputs import RequestOutput

if TYPE_CHECKING:
    from typing import Unpack  # 3.11+; only read by type checkers

    from kvmesh.events.config import PublisherConfig
    from kvmesh.replica.executor.factory import ExecutorOptions
    from kvmesh.replica.kv_transfer.agent import KVTransferAgent
    from kvmesh.replica.kv_transfer.leases import Lease
    from ray.util.placement_group import PlacementGroup


class AsyncLLM:
    """Thread-safe, asyncio-friendly front of one ``LLMEngine``; an ``EngineClient``.

    ``AsyncLLM(engine)`` fronts a ready engine; ``AsyncLLM.from_config(config)`` builds one.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.config = engine.config
        self.runner = engine.model_runner
        self.max_model_len = engine.max_model_len
        self.block_size = engine.config.block_size
        self.num_kv_blocks = engine.num_kv_blocks
        self.tensor_parallel_size = engine.config.tensor_parallel_size
        self.salt_secret_check = salt_secret_check(salt_secret_from_none_hash(engine.kv_cache_manager.none_hash))
        """What shows a router whether it keys salted prompts as this engine hashes them (``/server_info``)."""
        self.draining = False  # set by graceful shutdown: new requests get 503
        self._ids = itertools.count()
        kv_transfers = engine.connector(EngineKVTransfers)
        if kv_transfers is None:
            raise ValueError("AsyncLLM needs an engine with the KV transfer connector (default_kv_connectors)")
        self.kv_transfers: EngineKVTransfers = kv_transfers  # pulls in flight and leases (engine thread only)
        self.thread = EngineThread(engine, kv_transfers)
        self._streams = self.thread.streams

    @classmethod
    def from_config(cls, config: EngineConfig, hf_tokenizer: HFTokenizer | None = None,
                    model_runner: ModelRunnerInterface | None = None, events: PublisherConfig | None = None,
                    placement_group: PlacementGroup | None = None,
                    **executor_kwargs: Unpack[ExecutorOptions]) -> AsyncLLM:
        """Model runner, engine (build.py) and its thread; ``hf_tokenizer``: the server's, to detokenize."""
        return cls(engine=build_engine(config, hf_tokenizer, model_runner, events, placement_group, **executor_kwargs))

    @property
    def is_running(self) -> bool:
        return self.thread.is_running

    @property
    def errored(self) -> BaseException | None:
        """Why the engine loop itself died (None while it runs or after a clean shutdown)."""
        return self.thread.errored

    # -- caller side (any thread / event loop) -----------------------------------------------------

    async def generate(self, prompt: EngineRequest | list[int], sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs until its final one. ``prompt``: the whole request (engine_request.py),
        carried unchanged to the scheduler; or token ids, then sampled with ``sampling_params`` (vLLM's
        ``AsyncLLM.generate`` takes either). Raises ValueError for invalid input."""
        if not self.is_running:
            raise RuntimeError(f"the engine is not running ({self.errored!r}); restart the replica")
        request = prompt if isinstance(prompt, EngineRequest) else EngineRequest(
            request_id if request_id is not None else f"async-{next(self._ids)}", prompt,
            sampling_params if sampling_params is not None else SamplingParams())
        request_id = request.request_id
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use; use a unique id per request")
        out_queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), out_queue)
        accepted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(AddRequest(request, accepted))
        try:
            await asyncio.wrap_future(accepted)
        except BaseException:
            self._streams.pop(request_id, None)
            if not refused(accepted):  # cancelled: it may have been accepted just before, never left running
                self._submit(AbortRequests([request_id]))
            raise
        finished = False
        try:
            while not finished:
                out = await out_queue.get()
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(AbortRequests([request_id]))
                while not out_queue.empty():  # outputs it will never read
                    self._unread(out_queue.get_nowait())

    async def _ask(self, command: Callable[[concurrent.futures.Future], EngineCommand]):
        if not self.is_running:
            raise RuntimeError(f"the engine is not running ({self.errored!r}); restart the replica")
        answer: concurrent.futures.Future = concurrent.futures.Future()
        self._submit(command(answer))
        return await asyncio.wrap_future(answer)

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register an adapter on the engine thread (read and checked there); False when registered already.
        Raises ValueError saying why one cannot be served."""
        return await self._ask(lambda done: AddLoRA(lora_request, done))

    async def remove_lora(self, lora_name: str) -> bool:
        """Forget an adapter; False when unknown."""
        return await self._ask(lambda done: RemoveLoRA(lora_name, done))

    async def reset_prefix_cache(self) -> int:
        """Stop caching every block no request holds, between two steps (vLLM's; its events are sent at once):
        the whole cache (AllBlocksCleared) when none is held. How many blocks stopped being cached."""
        return await self._ask(ResetPrefixCache)

    async def pull_prefix(self, agent: KVTransferAgent, peer: str, prompt_token_ids: list[int],
                          remote_block_ids: list[int], cache_salt: str | None = None,
                          remote_block_media: list[str] | None = None, lora_name: str | None = None,
                          lora_identity: str | None = None) -> int:
        """Pull the prompt's cached prefix from ``peer`` into the prefix cache ahead of any request (tools and
        benchmarks); the tokens pulled. Read between steps: other requests keep stepping meanwhile."""
        return await self._ask(lambda pulled: PullPrefix(agent, peer, prompt_token_ids, remote_block_ids, cache_salt,
                                                         pulled, remote_block_media, lora_name, lora_identity))

    async def lease_blocks(self, prompt_token_ids: list[int], cache_salt: str | None, ttl_s: float,
                           peer: str = "local", lease_id: str | None = None, lora_name: str | None = None,
                           lora_identity: str | None = None) -> Lease:
        """Hold the prompt's cached leading blocks for ``peer`` (``/kv/lease``), or show lease ``lease_id`` when it
        holds this prompt's chain (leases.py; ``LeaseRefused`` otherwise or past a cap). Hashed off the engine
        thread."""
        hasher = await asyncio.to_thread(block_hasher, self.engine.kv_cache_manager, prompt_token_ids, cache_salt,
                                         lora_name, lora_identity)
        return await self._ask(lambda granted: LeaseBlocks(hasher.block_hashes, ttl_s, peer, granted, lease_id))

    async def release_lease(self, lease_id: str) -> int | None:
        """Let a lease's blocks go; the blocks it held, or None when no such lease is live."""
        return await self._ask(lambda released: ReleaseLease(lease_id, released))

    def list_loras(self) -> list[LoRARequest]:
        """The registered adapters (a racy copy of the engine thread's registry)."""
        return read_racily(self.engine.list_loras)

    async def abort(self, request_id: str) -> None:
        """End a request; its stream gets a final output with finish_reason "abort"."""
        self._submit(AbortRequests([request_id]))

    def get_stats(self) -> EngineStats:
        """The engine's stats (read without locking: gauges may be one step old)."""
        return self.engine.get_stats()

    def load_report(self) -> LoadReport:
        """Queue depth, KV usage and uncomputed prompt tokens (read racily from the engine thread's state)."""
        return load_report(self.engine)

    def dead_reason(self) -> str | None:
        """None while the replica can serve; otherwise why not."""
        if self.draining:
            return "shutting down"
        if self.errored is not None:
            return f"engine loop died: {self.errored!r}"
        if not self.is_running:
            return "engine stopped"
        return self.runner.dead_reason

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        """``dead_reason`` after probing the model runner (pings the TP ranks)."""
        self.runner.check_health(timeout_s)
        return self.dead_reason()

    def num_unfinished(self) -> int:
        return self.engine.get_num_unfinished_requests()

    def abort_all(self) -> int:
        """Abort every unfinished request (graceful shutdown's last resort); returns how many."""
        ids = read_racily(lambda: list(self.engine.scheduler.requests))
        if ids:
            self._submit(AbortRequests(ids))
        return len(ids)

    def abort_compiling(self) -> int:
        """Abort the requests still waiting for their grammar to compile (graceful shutdown's first step: they have
        nothing to finish, and a compile may run for compile_timeout_s); returns how many."""
        ids = read_racily(self.engine.structured_output.compiling_ids)
        if ids:
            self._submit(AbortRequests(ids))
        return len(ids)

    def shutdown(self) -> None:
        """Stop the engine thread, close the engine (and its publisher), then the model runner."""
        stopped = self.thread.stop(timeout_s=30)
        try:
            if stopped:
                self.engine.kv_connectors.shutdown()  # pulls in flight answered 0, leased blocks let go
            self.engine.close()
        finally:
            self.runner.shutdown()

    def _submit(self, command: EngineCommand) -> None:
        self.thread.submit(command)

    def _unread(self, out: RequestOutput) -> None:
        self.thread.unread(out)
