"""The engine thread's side of KV transfer: pulls in flight and leases, checked between steps.

    AsyncLLM engine thread:  drain commands (PullPrefix starts a read, LeaseBlocks / LeaseAtFinish / ReleaseLease)
                             kv.between_steps()      pulls polled without waiting, leases past their TTL ended
                             step() ...              other requests keep stepping while a read is in flight

A pull's read is started on the engine thread (its blocks allocated and held) and then only polled, the
way vLLM keeps a request in WAITING_FOR_REMOTE_KVS: on DONE the blocks are cached under the prompt's
hashes and freed to the evictable pool (the request added next hits them), on ERR or timeout they are
freed uncached. Each finished pull's bytes and seconds feed ``pull_bytes_per_s`` (an EWMA).

The prefill side of a P/D split leases at the request's finish, not after its answer: ``LeaseAtFinish``
arms the request id, and ``request_finished`` (the engine's hook, called before the request's blocks go
back to the evictable pool, as vLLM's connector's ``request_finished`` delays freeing) takes the lease,
so no step in between can evict them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kvmesh.replica.engine.commands import LeaseAtFinish, LeaseBlocks, PullPrefix, ReleaseLease
from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.kv_transfer.agent import block_bytes
from kvmesh.replica.kv_transfer.leases import Lease, LeaseRefused, LeaseTable
from kvmesh.replica.kv_transfer.prefix_pull import PendingPull, block_hasher, start_pull

logger = logging.getLogger(__name__)

EWMA_WEIGHT = 0.3
"""Weight of the newest pull in ``pull_bytes_per_s``."""
POLL_INTERVAL_S = 0.0005
"""How often an idle engine thread checks a read in flight."""


@dataclass(slots=True)
class _InFlight:
    pending: PendingPull
    command: PullPrefix
    started: float
    bytes_per_block: int


class EngineKVTransfers:
    """Pulls in flight and leases of one engine; only the engine thread calls its methods."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.leases = LeaseTable()
        self.pulls: list[_InFlight] = []
        self.pull_bytes_per_s: float | None = None
        """Bytes per second of this replica's finished pulls (EWMA; None before the first one)."""
        self.at_finish: dict[str, LeaseAtFinish] = {}
        """Requests whose finish takes a lease on their prompt's blocks (request id -> the command)."""
        engine.on_request_finished = self.request_finished
        engine.kv_cache_manager.held_elsewhere = self.held_blocks

    def handle(self, command: PullPrefix | LeaseBlocks | LeaseAtFinish | ReleaseLease) -> None:
        manager = self.engine.kv_cache_manager
        if isinstance(command, LeaseAtFinish):
            self.at_finish[command.request_id] = command
        elif isinstance(command, LeaseBlocks):
            _settle(command.granted, lambda: self.leases.grant(manager, command.block_hashes, command.ttl_s,
                                                               command.peer) if command.lease_id is None
                    else self.leases.lookup(manager, command.lease_id, command.block_hashes))
        elif isinstance(command, ReleaseLease):
            _settle(command.released, lambda: self.leases.release(manager, command.lease_id))
        else:
            self._start_pull(command)

    def request_finished(self, request: Request) -> None:
        """The engine's hook when a request ends, before its blocks are freed: an armed request that finished
        (stop or length) leases its prompt's cached full blocks (by the hashes the cache manager already holds);
        an aborted or failed one, or one past a lease cap, gets an empty lease."""
        command = self.at_finish.pop(request.request_id, None) if self.at_finish else None
        if command is None:
            return
        empty = Lease("", [], 0, command.ttl_s)
        if request.status not in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
            command.granted.set_result(empty)
            return
        manager = self.engine.kv_cache_manager
        hasher = manager.req_to_hasher.get(request.request_id)
        if hasher is None:  # caching off, or a request the cache never saw
            hasher = block_hasher(manager, request.prompt_token_ids, request.cache_salt, request.lora_name)
        hashes = hasher.block_hashes[: request.num_prompt_tokens // manager.block_size]
        try:
            command.granted.set_result(self.leases.grant(manager, hashes, command.ttl_s, command.peer))
        except LeaseRefused as e:  # the decode side computes the prompt
            logger.warning("prefill handle of %s holds no blocks: %s", request.request_id, e.message)
            command.granted.set_result(empty)

    def held_blocks(self) -> list:
        """Device blocks the leases and the pulls in flight hold (the pool's integrity check counts them)."""
        held = self.leases.held_device_blocks()
        for pull in self.pulls:
            held += pull.pending.local + pull.pending.new
        return held

    def request_refused(self, request_id: str) -> None:
        """The request never ran (``add_request`` refused it): an armed lease ends empty."""
        command = self.at_finish.pop(request_id, None)
        if command is not None:
            command.granted.set_result(Lease("", [], 0, command.ttl_s))

    def _start_pull(self, command: PullPrefix) -> None:
        try:
            pending = start_pull(self.engine.kv_cache_manager, command.agent, command.peer,
                                 command.prompt_token_ids, command.remote_block_ids, command.cache_salt,
                                 remote_block_media=command.remote_block_media)
        except BaseException as e:  # KVTransferError (dead peer) or bad arguments (ids out of range)
            command.pulled.set_exception(e)
            return
        if isinstance(pending, int):
            command.pulled.set_result(pending)  # nothing missing, or no room: the prompt is computed
        else:
            self.pulls.append(_InFlight(pending, command, time.monotonic(), block_bytes(command.agent)))

    def between_steps(self) -> None:
        """Finish the pulls whose read ended and the leases past their TTL; never waits."""
        if self.pulls:
            now = time.monotonic()
            still = []
            for pull in self.pulls:
                try:
                    tokens = pull.pending.poll(now)
                except BaseException as e:  # KVTransferError: the blocks were freed uncached
                    pull.command.pulled.set_exception(e)
                    continue
                if tokens is None:
                    still.append(pull)
                    continue
                if tokens:
                    self._measure(tokens // self.engine.config.block_size * pull.bytes_per_block, now - pull.started)
                pull.command.pulled.set_result(tokens)
            self.pulls = still
        if self.leases.active:
            self.leases.expire(self.engine.kv_cache_manager)

    def _measure(self, num_bytes: int, seconds: float) -> None:
        rate = num_bytes / max(seconds, 1e-6)
        old = self.pull_bytes_per_s
        self.pull_bytes_per_s = rate if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * rate

    def idle_timeout(self) -> float | None:
        """How long an idle engine thread may sleep: a short poll while a read is in flight, until the next
        lease expiry while leases are held, else until woken (None)."""
        if self.pulls:
            return POLL_INTERVAL_S
        return self.leases.next_expiry_s()

    def abandon(self) -> None:
        """Engine stopping: free what pulls and leases hold."""
        for pull in self.pulls:
            pull.pending.transfer.release()
            pull.pending.fail()
            pull.command.pulled.set_exception(RuntimeError("the engine stopped while a KV pull was in flight"))
        self.pulls = []
        for request_id in list(self.at_finish):
            self.request_refused(request_id)
        self.leases.expire(self.engine.kv_cache_manager, now=float("inf"))


def _settle(future, compute) -> None:
    try:
        future.set_result(compute())
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        future.set_exception(e)
