"""The holder's KV transfer routes: what a peer replica calls to read this replica's blocks.

    GET  /kv/handshake   msgpack KVHandshake (application/msgpack): agent name, transport metadata, layout
    POST /kv/lease       {"prompt_token_ids": [...], "cache_salt": str|null, "ttl_s": float?}
                         -> {"lease_id", "remote_block_ids", "remote_block_media" ("GPU"|"CPU" per block:
                             blocks past the device's prefix may live only in the host tier), "num_tokens",
                             "remote_engine_id", "expires_in_s"}
    POST /kv/release     {"lease_id": str} -> {"released_blocks": int}; 404 for an unknown or expired lease

Behind ``--api-key`` like every path that reveals or changes state (AuthMiddleware); 503 when the replica
has KV transfer off. Leasing and releasing run on the engine thread (its command queue).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError
from pydantic import Field

if TYPE_CHECKING:
    from kvmesh.replica.server.kv_transfer import KVTransferService
    from kvmesh.replica.server.state import ServerState

MAX_LEASE_TTL_S = 3600.0
"""Longest lease a peer may ask for (an hour): a lease pins blocks, so a typo must not pin them for days."""


class LeaseRequest(OpenAIBaseModel):
    prompt_token_ids: list[Annotated[int, Field(strict=True, ge=0)]]
    cache_salt: str | None = None
    ttl_s: Annotated[float, Field(gt=0, le=MAX_LEASE_TTL_S)] | None = None


class ReleaseRequest(OpenAIBaseModel):
    lease_id: Annotated[str, Field(min_length=1)]


def install_kv_routes(app: FastAPI, state: ServerState) -> None:
    def service() -> KVTransferService:
        if state.kv_transfer is None:
            raise ProtocolError("KV transfer is off on this replica; start it with --kv-transfer", 503)
        return state.kv_transfer

    async def close_client() -> None:  # the pulls' HTTP client session, on the server's loop
        if state.kv_transfer is not None:
            await state.kv_transfer.close()

    app.router.on_shutdown.append(close_client)

    @app.get("/kv/handshake")
    async def handshake():
        return Response(service().handshake_bytes(), media_type="application/msgpack")

    @app.post("/kv/lease")
    async def lease(http: Request):
        kv = service()
        req = await read_request(http, LeaseRequest, state.frontend, state.renderer.run)
        ttl_s = kv.config.lease_ttl_s if req.ttl_s is None else req.ttl_s
        granted = await state.engine_client.lease_blocks(req.prompt_token_ids, req.cache_salt, ttl_s)
        return JSONResponse({"lease_id": granted.lease_id, "remote_block_ids": granted.remote_block_ids,
                             "remote_block_media": granted.remote_block_media,
                             "num_tokens": granted.num_tokens, "remote_engine_id": kv.agent.name,
                             "expires_in_s": granted.expires_in_s})

    @app.post("/kv/release")
    async def release(http: Request):
        service()
        req = await read_request(http, ReleaseRequest, state.frontend, state.renderer.run)
        released = await state.engine_client.release_lease(req.lease_id)
        if released is None:
            raise ProtocolError(f"lease {req.lease_id!r} is unknown, already released or expired", 404,
                                param="lease_id")
        return JSONResponse({"released_blocks": released})
