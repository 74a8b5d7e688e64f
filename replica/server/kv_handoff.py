"""``kv_transfer_params`` on the completion endpoints: pull before the request, lease after it.

    decode side  {"do_remote_prefill": true, "remote_url": ...}  -> ``before``: the pull (kv_transfer.py), then
                 the request runs as usual and hits the pulled blocks (they count in cached_tokens)
    prefill side {"do_remote_decode": true}                      -> ``arm`` before the request runs: the engine
                 thread leases the prompt's blocks the moment it finishes (before they could be evicted);
                 ``after``: that lease returned as the response's top-level ``kv_transfer_params``

Every completion answer carries ``x-kvmesh-kv-pulled-tokens`` and ``x-kvmesh-kv-pulled-bytes`` (0 without a
pull) and, when a pull was tried, ``x-kvmesh-kv-pull: ok|failed|skipped``.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

from fastapi import Request
from kvmesh.replica.server.kv_peers import peer_of
from kvmesh.replica.server.kv_transfer import PullResult

if TYPE_CHECKING:
    from kvmesh.replica.kv_transfer.leases import Lease
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.replica.server.state import ServerState

NO_PULL = {"x-kvmesh-kv-pulled-tokens": "0", "x-kvmesh-kv-pulled-bytes": "0"}


async def before(state: ServerState, req: CompletionRequest | ChatCompletionRequest, prompts: list[list[int]],
                 http: Request) -> dict[str, str]:
    """Check ``kv_transfer_params`` (a 400 naming the field) and run the decode side's pull; the response headers."""
    params = req.kv_transfer_params
    if params is None:
        return dict(NO_PULL)
    params.check(len(prompts), req.stream)
    if not params.do_remote_prefill:
        return dict(NO_PULL)
    if state.kv_transfer is None:  # transfer off here: computed, said so
        return PullResult("skipped").headers()
    # the cluster's internal key; a replica without one (loopback only) passes on the caller's header, which
    # goes to a registered peer only
    key = state.server.internal_key
    auth = f"Bearer {key}" if key else http.headers.get("authorization")
    lora = state.loras.request_for(req.model)  # the adapter keys the hashes on both sides
    result = await state.kv_transfer.pull(params, prompts[0], req.cache_salt, auth, lora)
    return result.headers()


def arm(state: ServerState, req: CompletionRequest | ChatCompletionRequest, request_id: str,
        http: Request) -> concurrent.futures.Future[Lease] | None:
    """The prefill side: arm the lease the engine takes when ``request_id`` (the prompt's first candidate)
    finishes, counted against the caller's lease cap; call before the request is queued. None: no lease asked,
    or transfer off here."""
    params = req.kv_transfer_params
    if params is None or not params.do_remote_decode or state.kv_transfer is None:
        return None
    return state.kv_transfer.lease_at_finish(request_id, peer_of(http))


async def after(state: ServerState, req: CompletionRequest | ChatCompletionRequest,
                armed: concurrent.futures.Future[Lease] | None) -> dict | None:
    """The prefill side's ``kv_transfer_params`` for the response (None: the request asked for none)."""
    params = req.kv_transfer_params
    if params is None or not params.do_remote_decode:
        return None
    if state.kv_transfer is None or armed is None:  # nothing to hand over: the decode side computes the prompt
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [], "remote_lease_id": "",
                "remote_engine_id": "", "num_tokens": 0}
    return await state.kv_transfer.handle(armed)
