"""``kv_transfer_params`` on the completion endpoints: checked here (a 400 naming the field), then they ride with
the request into the engine in its one ``generate`` call; what the transfer did comes back on its outputs.

    decode side  {"do_remote_prefill": true, "remote_url": ...}  the engine's scheduler holds the request while
                 the prompt's blocks are read from the peer (server/kv_transfer.py asks the peer), then it runs
                 hitting them (they count in cached_tokens); its first output's ``kv_pull`` -> the headers
    prefill side {"do_remote_decode": true}  the engine leases the prompt's blocks as the request finishes, counted
                 against the caller's lease cap; its final output's ``kv_lease`` -> the response's
                 top-level ``kv_transfer_params``

Every completion answer carries ``x-kvmesh-kv-pulled-tokens`` and ``x-kvmesh-kv-pulled-bytes`` (0 without a
pull) and, when a pull was tried, ``x-kvmesh-kv-pull: ok|failed|skipped``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING

from fastapi import Request
from kvmesh.replica.engine.remote_kv import NO_PULL, PullResult, RemoteKV
from kvmesh.replica.server.kv_peers import peer_of
from kvmesh.replica.server.parallel_sampling import chain
from kvmesh.replica.serving.errors import ProtocolError

if TYPE_CHECKING:
    from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
    from kvmesh.replica.server.parallel_sampling import Outputs
    from kvmesh.replica.server.state import ServerState
    from kvmesh.replica.step.outputs import RequestOutput

NO_HANDLE = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [], "remote_lease_id": "",
             "remote_engine_id": "", "num_tokens": 0}
"""The prefill side's answer when this replica has nothing to hand over: the decode side computes the prompt."""


def engine_params(state: ServerState, req: CompletionRequest | ChatCompletionRequest, prompts: list[list[int]],
                  http: Request) -> RemoteKV | None:
    """Check ``kv_transfer_params`` (a 400 naming the field) and what the engine takes of them (None: nothing, or
    transfer off here)."""
    params = req.kv_transfer_params
    if params is None:
        return None
    params.check(len(prompts), req.stream)
    if state.kv_transfer is None:
        return None
    # the cluster's internal key; a replica without one (loopback only) passes on the caller's header, which
    # goes to a registered peer only
    key = state.server.internal_key
    auth = f"Bearer {key}" if key else http.headers.get("authorization")
    lora = state.loras.request_for(req.model)  # the adapter keys the hashes on both sides
    return state.kv_transfer.request_params(params, prompts[0], req.cache_salt, auth, lora, peer_of(http))


async def client_gone(request: Request) -> None:
    """Returns when the client goes away (the ASGI receive channel says ``http.disconnect``): ``start_or_leave``'s
    ``gone``."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def start_or_leave(start: Coroutine, gone: Coroutine | None) -> list[Outputs]:
    """``start`` (queue the candidates, read their first outputs); with ``gone`` (the client's disconnect, watched
    while the engine waits for a pull's blocks or a grammar's compile) a client that leaves first cancels it: the
    request is aborted, its
    read given up and the holder's lease let go, and the answer is a 499."""
    if gone is None:
        return await start
    started, left = asyncio.ensure_future(start), asyncio.ensure_future(gone)
    try:
        await asyncio.wait({started, left}, return_when=asyncio.FIRST_COMPLETED)
        if started.done():
            return started.result()
        started.cancel()  # closing its generate aborts the engine request
        await asyncio.wait({started})
        raise ProtocolError("client disconnected", 499)
    finally:
        left.cancel()
        if not started.done():  # this handler itself was cancelled: so is what it started
            started.cancel()


async def pull_headers(req: CompletionRequest | ChatCompletionRequest, kv: RemoteKV | None,
                       streams: list[Outputs]) -> dict[str, str]:
    """The response's pull headers: read off the first output of the prompt's first candidate (queued with the
    pull, ``kv``), which stays first in its stream; the holder's lease is let go before the answer starts."""
    params = req.kv_transfer_params
    if params is None or not params.do_remote_prefill:
        return dict(NO_PULL)
    if kv is None or kv.remote is None:  # transfer off here: computed, said so
        return PullResult("skipped").headers()
    first = await anext(streams[0])
    streams[0] = chain(first, streams[0])
    await kv.remote.ended()
    return (first.kv_pull or PullResult("failed")).headers()


def handle(req: CompletionRequest | ChatCompletionRequest, final: RequestOutput) -> dict | None:
    """The prefill side's ``kv_transfer_params`` for the response (None: the request asked for none)."""
    params = req.kv_transfer_params
    if params is None or not params.do_remote_decode:
        return None
    return final.kv_lease if final.kv_lease is not None else dict(NO_HANDLE)
