"""The engine thread's side of KV transfer: pulls in flight and leases, checked between steps.

    AsyncLLM engine thread:  drain commands (PullPrefix starts a read, LeaseBlocks / ReleaseLease)
                             kv.between_steps()      pulls polled without waiting, leases past their TTL ended
                             step() ...              other requests keep stepping while a read is in flight

A pull's blocks are allocated and held on the engine thread, which hands the read to the agent's transfer
worker thread (pull_read.py: starting a read can copy synchronously, nixl on host memory) and then only
reads the worker's flags, the way vLLM keeps a request in WAITING_FOR_REMOTE_KVS: on DONE the blocks are
cached under the prompt's hashes and freed to the evictable pool (the request added next hits them). On ERR
or timeout the pull fails at once, but its blocks are QUARANTINED (held: never free, reused or hashed;
counted in ``quarantined_blocks`` and the pool's integrity check) until the transport confirms the read is
over, then freed uncached: a read that lands late lands in blocks nobody else holds. Each finished pull's
bytes and seconds feed ``pull_bytes_per_s`` (an EWMA).

A request's own pull rides its ``kv_transfer_params`` into the scheduler (remote_loads.py: the request waits in
WAITING_FOR_REMOTE_KVS while its read is polled here). The prefill side of a P/D split leases at the request's
finish: ``request_finished`` (called before its blocks go back to the evictable pool, as vLLM's connector's
delays freeing) takes the lease, so no step in between can evict them, and returns the handle its final output
carries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.replica.engine.commands import LeaseBlocks, PullPrefix, ReleaseLease, answer, refuse
from kvmesh.replica.engine.remote_loads import RemoteLoads
from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.engine.step_time import LinearFit
from kvmesh.replica.kv_transfer.agent import block_bytes
from kvmesh.replica.kv_transfer.leases import Lease, LeaseCaps, LeaseRefused, LeaseTable
from kvmesh.replica.kv_transfer.prefix_pull import PendingPull, block_hasher, start_pull

if TYPE_CHECKING:
    from kvmesh.kvcache.block import KVCacheBlock
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager
    from kvmesh.replica.engine.kv_connector import KVConnectorContext
    from kvmesh.replica.serving.load_report import KVTransferLoad

logger = logging.getLogger(__name__)

EWMA_WEIGHT = 0.3
"""Weight of the newest pull in ``pull_bytes_per_s``."""
POLL_INTERVAL_S = 0.0005
"""How often an idle engine thread checks a read in flight when no transfer worker can wake it."""


@dataclass(slots=True)
class _InFlight:
    pending: PendingPull
    started: float
    bytes_per_block: int
    end: Callable[[int | BaseException], None]
    """Told the tokens pulled, or the error the read failed with."""


class EngineKVTransfers:
    """Pulls in flight and leases of one engine, a ``KVConnector`` (kv_connector.py); only the engine thread calls
    its methods."""

    def __init__(self, context: KVConnectorContext) -> None:
        self.kv_cache_manager: KVCacheManager = context.kv_cache_manager
        self.block_size = context.config.block_size
        self.leases = LeaseTable()
        self.pulls: list[_InFlight] = []
        self.quarantine: list[PendingPull] = []
        """Failed pulls whose read the transport has not yet confirmed over: their blocks stay held."""
        self.pull_bytes_per_s: float | None = None
        """Bytes per second of this replica's finished pulls (EWMA; None before the first one)."""
        self.pull_time = LinearFit(1)
        """Its pulls' seconds fitted as ``fixed + bytes * s_per_byte`` (step_time.py): the fixed part of a pull."""
        self._load: Callable[[], KVTransferLoad] | None = None
        self.wake: Callable[[], None] | None = None
        """Wakes the idle engine thread (AsyncLLM sets it); the transfer workers call it when a read moves on."""
        self.remote = RemoteLoads(self.kv_cache_manager, self.block_size, self._track, self._wake_up)
        """The requests' own pulls (their ``kv_transfer_params``), waiting in the scheduler."""

    def _wake_up(self) -> None:
        if self.wake is not None:
            self.wake()

    def handle(self, command: PullPrefix | LeaseBlocks | ReleaseLease) -> None:
        manager = self.kv_cache_manager
        if isinstance(command, LeaseBlocks) and command.lease_id is None:
            lease = _settle(command.granted, lambda: self.leases.grant(manager, command.block_hashes, command.ttl_s,
                                                                       command.peer))
            if lease is not None and lease.lease_id:  # its caller gave up: nobody will release it
                self.leases.release(manager, lease.lease_id)
        elif isinstance(command, LeaseBlocks):
            _settle(command.granted, lambda: self.leases.lookup(manager, command.lease_id, command.block_hashes))
        elif isinstance(command, ReleaseLease):
            _settle(command.released, lambda: self.leases.release(manager, command.lease_id))
        else:
            self._start_pull(command)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """A request asking a pull: None until the holder said what it has, then the tokens read asynchronously."""
        if request.remote_kv is None:
            return 0, False
        return self.remote.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: list[KVCacheBlock], num_external_tokens: int) -> None:
        """Start the read ``get_num_new_matched_tokens`` promised (into blocks this connector holds)."""
        self.remote.start(request)

    def get_finished(self) -> set[str]:
        """Requests whose pull ended (read, failed or refused) since the last call."""
        return self.remote.take_finished() if self.remote.finished else set()

    def request_finished(self, request: Request) -> dict | None:
        """A request ended, before its blocks are freed: a pull it still waited for is let go; a request asking a
        lease that finished (stop or length) leases its prompt's cached full blocks (by the hashes the cache
        manager already holds) and returns the handle; an aborted or failed one, or one past a lease cap, an
        empty handle."""
        params = request.remote_kv
        if params is None:
            return None
        if self.remote.loads:
            self.remote.abort(request.request_id)
        if params.lease_ttl_s is None:
            return None
        return params.handle(self._lease_at_finish(request, params.lease_ttl_s, params.peer))

    def _lease_at_finish(self, request: Request, ttl_s: float, peer: str) -> Lease:
        empty = Lease("", [], 0, ttl_s)
        if request.status not in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
            return empty
        manager = self.kv_cache_manager
        hasher = manager.req_to_hasher.get(request.request_id)
        if hasher is None:  # caching off, or a request the cache never saw
            hasher = block_hasher(manager, request.prompt_token_ids, request.cache_salt, request.lora_name,
                                  request.lora_identity)
        hashes = hasher.block_hashes[: request.num_prompt_tokens // manager.block_size]
        try:
            return self.leases.grant(manager, hashes, ttl_s, peer)
        except LeaseRefused as e:  # the decode side computes the prompt
            logger.warning("prefill handle of %s holds no blocks: %s", request.request_id, e.message)
            return empty

    def held_blocks(self) -> list:
        """Device blocks the leases and the pulls in flight hold (the pool's integrity check counts them)."""
        held = self.leases.held_device_blocks()
        for pull in self.pulls:
            held += pull.pending.local + pull.pending.new
        for pending in self.quarantine:
            held += pending.local + pending.new
        return held

    @property
    def quarantined_blocks(self) -> int:
        """Blocks of failed pulls held until the transport confirms their read is over (read racily by metrics)."""
        return sum(len(pending.new) for pending in list(self.quarantine))

    def _start_pull(self, command: PullPrefix) -> None:
        try:
            pending = start_pull(self.kv_cache_manager, command.agent, command.peer,
                                 command.prompt_token_ids, command.remote_block_ids, command.cache_salt,
                                 command.lora_name, remote_block_media=command.remote_block_media,
                                 on_progress=self.wake, lora_identity=command.lora_identity)
        except BaseException as e:  # bad arguments (media not matching the ids)
            refuse(command.pulled, e)
            return
        if isinstance(pending, int):
            answer(command.pulled, pending)  # nothing missing, or no room: the prompt is computed
        else:  # a caller gone leaves the blocks cached, as any pull
            self._track(pending, block_bytes(command.agent),
                        lambda end: refuse(command.pulled, end) if isinstance(end, BaseException)
                        else answer(command.pulled, end))

    def _track(self, pending: PendingPull, bytes_per_block: int, end: Callable[[int | BaseException], None]) -> None:
        self.pulls.append(_InFlight(pending, time.monotonic(), bytes_per_block, end))

    def between_steps(self) -> None:
        """Finish the pulls whose read ended, free the quarantined blocks whose read is over, end the leases past
        their TTL; never waits (only the transfer workers' flags are read)."""
        if self.pulls:
            now = time.monotonic()
            still = []
            for pull in self.pulls:
                try:
                    tokens = pull.pending.poll(now)
                except BaseException as e:  # KVTransferError (or bad block ids): the blocks are quarantined
                    if not pull.pending.settle():
                        self.quarantine.append(pull.pending)
                    pull.end(e)
                    continue
                if tokens is None:
                    still.append(pull)
                    continue
                if tokens:
                    self._measure(tokens // self.block_size * pull.bytes_per_block, now - pull.started)
                pull.end(tokens)
            self.pulls = still
        if self.quarantine:
            self.quarantine = [pending for pending in self.quarantine if not pending.settle()]
        if self.leases.active:
            self.leases.expire(self.kv_cache_manager)

    def _measure(self, num_bytes: int, seconds: float) -> None:
        rate = num_bytes / max(seconds, 1e-6)
        self.pull_time.record(seconds, float(num_bytes))
        old = self.pull_bytes_per_s
        self.pull_bytes_per_s = rate if old is None else (1 - EWMA_WEIGHT) * old + EWMA_WEIGHT * rate

    def idle_timeout(self) -> float | None:
        """How long an idle engine thread may sleep: until the first pull's deadline (the transfer workers wake it
        when a read moves on; without that hook, a short poll) or the next lease expiry, else until woken."""
        waits = []
        if self.pulls:
            first = min(pull.pending.deadline for pull in self.pulls) - time.monotonic()
            waits.append(POLL_INTERVAL_S if self.wake is None else max(first, 0.0))
        if self.quarantine and self.wake is None:
            waits.append(POLL_INTERVAL_S)
        if (lease := self.leases.next_expiry_s()) is not None:
            waits.append(lease)
        return min(waits) if waits else None

    def update_connector_output(self) -> None:
        return None  # pulls are polled between steps, idle or not (``between_steps``)

    def turn_on(self, caps: LeaseCaps, load: Callable[[], KVTransferLoad]) -> None:
        """The replica turned KV transfer on (runtime.py, before its server takes a lease): the lease caps, and
        ``load`` gives ``/load``'s ``kv_transfer`` object (its transfer service's, server/kv_transfer.py)."""
        self.leases.caps = caps
        self._load = load

    @property
    def pull_fixed_s(self) -> float | None:
        """Seconds a pull costs besides its bytes (the fit's intercept); None until pulls of two sizes told it."""
        coef = self.pull_time.coefficients()
        return coef[0] if coef is not None and coef[1] > 0 else None

    def load_fields(self) -> dict:
        """``/load``'s ``kv_transfer`` object once KV transfer is on (read off the engine thread)."""
        return {} if self._load is None else {"kv_transfer": self._load()}

    def shutdown(self) -> None:
        self.abandon()

    def abandon(self) -> None:
        """Engine stopping (its thread gone): answer the pulls in flight, ask their reads to abort, let the leases
        go. Blocks whose read the transport has not confirmed over are NOT freed: they stay held in the pool that
        goes with the engine (the agent keeps the cache registered, so a late write still lands in its memory)."""
        stopped = RuntimeError("the engine stopped while a KV pull was in flight")
        for request_id in list(self.remote.loads):
            self.remote.abort(request_id)
        for pull in self.pulls:
            pull.pending.read.give_up(stopped)
            pull.end(stopped)
            self.quarantine.append(pull.pending)
        self.pulls = []
        self.quarantine = [pending for pending in self.quarantine if not pending.settle()]
        if self.quarantine:
            logger.warning("engine stopped with %d KV blocks still quarantined (reads the transport has not "
                           "confirmed over); they stay held", self.quarantined_blocks)
        self.leases.expire(self.kv_cache_manager, now=float("inf"))


def _settle(future, compute):
    """Answer ``future`` with ``compute()`` (or refuse it with what that raised); the value when nobody reads it
    (the caller gave up: the engine undoes it), else None."""
    try:
        value = compute()
    except BaseException as e:  # noqa: BLE001 - handed to the caller
        refuse(future, e)
        return None
    return None if answer(future, value) else value
