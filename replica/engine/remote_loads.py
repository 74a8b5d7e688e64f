"""The KV transfer connector's loads for requests: a request whose ``kv_transfer_params`` ask a pull from a peer
(the decode side of a P/D split, or a peer the router chose) waits in the scheduler while its blocks come.

    scheduler: get_num_new_matched_tokens  -> ``matched``: the first ask starts the source's lookup (the holder's
                                              lease and the handshake, on the server's loop) and answers None
                                              (not known yet) until it resolved; then the tokens past the local
                                              prefix, loaded asynchronously
               update_state_after_alloc    -> ``start``: the read starts (kv_transfer/prefix_pull.py: its blocks
                                              held by the connector, cached as it lands)
    between steps: the read polled; at its end ``kv_pull`` is set on the request, the source told (the holder's
                   lease let go, the pull counted) and ``get_finished`` names the request: it runs next, hitting
                   the pulled blocks in the prefix cache (a failed or refused pull: it computes the prompt)
    request aborted while it waits: ``abort``; a lookup in flight still ends with its lease let go, a read in
                   flight is given up (its blocks quarantined until the transport confirms it over, then freed)

Only the engine thread calls it; the lookup's future wakes the engine thread when it resolves.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.replica.engine.remote_kv import PullResult, RemoteBlocks, RemoteSource
from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.kv_transfer.agent import block_bytes
from kvmesh.replica.kv_transfer.errors import KVTransferError
from kvmesh.replica.kv_transfer.prefix_pull import PendingPull, start_pull

if TYPE_CHECKING:
    from kvmesh.kvcache.kv_cache_manager import KVCacheManager

logger = logging.getLogger(__name__)

Track = Callable[[PendingPull, int, Callable[[int | BaseException], None]], None]
"""Hands a started read to the connector's polling: (pull, bytes per block, told its tokens or its error)."""


@dataclass(slots=True)
class _Load:
    request: Request
    source: RemoteSource
    lookup: concurrent.futures.Future
    blocks: RemoteBlocks | None = None
    pending: PendingPull | None = None
    aborted: bool = False
    ended: bool = False


class RemoteLoads:
    """The loads of one engine's requests (see the module doc)."""

    def __init__(self, manager: KVCacheManager, block_size: int, track: Track, wake: Callable[[], None]) -> None:
        self.manager, self.block_size, self.track, self.wake = manager, block_size, track, wake
        self.loads: dict[str, _Load] = {}
        self.finished: set[str] = set()
        """Requests in WAITING_FOR_REMOTE_KVS whose load ended since the scheduler last asked."""

    def matched(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """``get_num_new_matched_tokens`` of a request that asks a pull."""
        source = request.remote_kv.remote
        if source is None or request.kv_pull is not None:  # none asked, or it ended already
            return 0, False
        load = self.loads.get(request.request_id)
        if load is None:
            lookup = source.lookup()
            self.loads[request.request_id] = _Load(request, source, lookup)
            lookup.add_done_callback(lambda _: self.wake())
            return None, False
        if not load.lookup.done():
            return None, False
        try:
            found = load.lookup.result()
        except BaseException as e:  # noqa: BLE001 - a source that broke: the prompt is computed
            self._end(load, PullResult("failed"), e)
            return 0, False
        if isinstance(found, PullResult):
            self._end(load, found)
            return 0, False
        tokens = len(found.block_ids) * self.block_size - num_computed_tokens
        if tokens <= 0:  # this replica holds as much already
            self._end(load, PullResult("skipped"))
            return 0, False
        load.blocks = found
        return tokens, True

    def start(self, request: Request) -> None:
        """``update_state_after_alloc``: start the read of a request ``matched`` promised tokens to."""
        load = self.loads.get(request.request_id)
        if load is None or load.blocks is None or load.pending is not None:
            return
        b = load.blocks
        try:
            pending = start_pull(self.manager, b.agent, b.peer, request.prompt_token_ids, b.block_ids,
                                 request.cache_salt, request.lora_name, remote_block_media=b.media,
                                 on_progress=self.wake, lora_identity=request.lora_identity)
        except BaseException as e:  # noqa: BLE001 - bad arguments (media not matching the ids)
            self._end(load, PullResult("failed"), e)
            return
        if isinstance(pending, int):  # nothing missing, or no room: the prompt is computed
            self._end(load, PullResult("skipped"))
            return
        load.pending = pending
        per_block = block_bytes(b.agent)
        self.track(pending, per_block, lambda outcome: self._read(load, outcome, per_block))

    def _read(self, load: _Load, outcome: int | BaseException, per_block: int) -> None:
        if isinstance(outcome, BaseException):
            self._end(load, PullResult("failed"), outcome)
        else:
            self._end(load, PullResult("ok", outcome, outcome // self.block_size * per_block) if outcome
                      else PullResult("skipped"))

    def _end(self, load: _Load, result: PullResult, error: BaseException | None = None) -> None:
        if load.ended:
            return
        load.ended = True
        rid = load.request.request_id
        if self.loads.get(rid) is load:
            del self.loads[rid]
        try:
            load.source.done(result, None if load.aborted else error)
        except Exception:  # noqa: BLE001 - the server's half failing must not stop the engine thread
            logger.exception("ending the KV pull of %s failed", rid)
        if not load.aborted:
            load.request.kv_pull = result
            if load.request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished.add(rid)

    def abort(self, request_id: str) -> None:
        """The request ended while it waited: let the holder's lease go, give its read up."""
        load = self.loads.pop(request_id, None)
        if load is None:
            return
        load.aborted = True
        if load.pending is None:
            self._end(load, PullResult("failed"))
        else:  # its poll ends it: the blocks quarantined until the transport confirms the read over
            load.pending.read.give_up(KVTransferError(f"request {request_id} ended while its KV was read"))

    def take_finished(self) -> set[str]:
        finished, self.finished = self.finished, set()
        return finished
