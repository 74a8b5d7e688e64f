"""The holder's KV transfer routes: what a peer replica (or the router) calls; the KV plane, internal key only.

    GET  /kv/handshake   msgpack KVHandshake (application/msgpack): agent name, transport metadata, layout
    POST /kv/lease       {"prompt_token_ids": [...], "cache_salt": str|null, "ttl_s": float?, "lease_id": str?,
                          "lora_name": str?, "lora_identity": str?}
                         -> {"lease_id", "remote_block_ids", "remote_block_media" ("GPU"|"CPU" per block:
                             blocks past the device's prefix may live only in the host tier), "num_tokens",
                             "remote_engine_id", "expires_in_s"}
                         without lease_id: a new lease on the prompt's cached leading blocks ("" and [] when none
                         is cached); ttl_s above kv_transfer.max_lease_ttl_s is clamped to it.
                         with lease_id (a P/D handle's): that lease's blocks, only when the chain it holds leads
                         the chain of these token ids and salt; 409 when it does not, 404 when no such lease.
                         429 past a lease cap (per peer: x-kvmesh-replica-id, else the client address; in total;
                         leased blocks). 413 for a body over 12 bytes per token of max_model_len + 4 KiB, 400
                         for more than max_model_len token ids (checked before anything is hashed).
    POST /kv/release     {"lease_id": str} -> {"released_blocks": int}; 404 for an unknown or expired lease
    POST /kv/peers       {"router_id": str?, "ttl_s": float?, "peers": [{"replica_id": str, "url": str}, ...]}
                         -> {"peers": int, "routers": int}: a router's replica set, replacing that router's last
                         one and lapsing after ttl_s unless renewed; the peers are every router's, merged
                         (kv_peers.py: whom this replica may pull from)

503 when the replica has KV transfer off. The prompt is hashed on a worker thread; leasing and releasing run on
the engine thread (its command queue), which only looks the hashes up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from kvmesh.replica.kv_transfer.leases import LeaseRefused
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.server.kv_peers import peer_of
from kvmesh.replica.serving.errors import ProtocolError, echo
from pydantic import Field

if TYPE_CHECKING:
    from kvmesh.replica.server.kv_transfer import KVTransferService
    from kvmesh.replica.server.state import ServerState

BYTES_PER_TOKEN = 12
"""Most bytes a token id takes in a /kv/lease body (up to 10 digits, a comma, a space)."""
BODY_SLACK_BYTES = 4096
"""Room for the rest of a /kv/lease body (salt, lease id, ttl)."""
MAX_PEERS = 4096
"""Most replicas one /kv/peers body may register."""
MAX_REGISTRATION_TTL_S = 3600.0
"""The longest a /kv/peers registration may live without being renewed."""


class LeaseRequest(OpenAIBaseModel):
    prompt_token_ids: list[Annotated[int, Field(strict=True, ge=0)]]
    cache_salt: str | None = None
    ttl_s: Annotated[float, Field(gt=0)] | None = None
    lease_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    lora_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The LoRA adapter the prompt runs with (it keys the hashes); None: the base model."""
    lora_identity: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    """The identity of the asker's weights of that adapter (it keys the hashes after the name): blocks of other
    weights under the same name are never leased."""


class ReleaseRequest(OpenAIBaseModel):
    lease_id: Annotated[str, Field(min_length=1)]


class Peer(OpenAIBaseModel):
    replica_id: Annotated[str, Field(min_length=1, max_length=256)]
    url: Annotated[str, Field(min_length=1, max_length=2048)]


class PeersRequest(OpenAIBaseModel):
    peers: Annotated[list[Peer], Field(max_length=MAX_PEERS)]
    router_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The registering router (its set replaces only its own); None: one anonymous router's."""
    ttl_s: Annotated[float, Field(gt=0, le=MAX_REGISTRATION_TTL_S)] | None = None
    """Seconds the set lives unless the router registers again; None: until replaced."""


def lease_body_limit(max_model_len: int) -> int:
    """The most bytes a /kv/lease body may have: its token ids for a prompt of ``max_model_len`` and slack."""
    return BYTES_PER_TOKEN * max_model_len + BODY_SLACK_BYTES


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
        max_len = state.engine_client.max_model_len
        req = await read_request(http, LeaseRequest, state.frontend, state.renderer.run, lease_body_limit(max_len))
        if len(req.prompt_token_ids) > max_len:
            raise ProtocolError(f"prompt_token_ids has {len(req.prompt_token_ids)} tokens; this replica's "
                                f"max_model_len is {max_len}", param="prompt_token_ids")
        try:
            granted = await state.engine_client.lease_blocks(req.prompt_token_ids, req.cache_salt,
                                                             kv.lease_ttl_s(req.ttl_s), peer_of(http), req.lease_id,
                                                             req.lora_name, req.lora_identity)
        except LeaseRefused as e:
            raise ProtocolError(e.message, e.status, param="lease_id" if e.status in (404, 409) else None) from None
        return JSONResponse({"lease_id": granted.lease_id, "remote_block_ids": granted.remote_block_ids,
                             "remote_block_media": granted.remote_block_media,
                             "num_tokens": granted.num_tokens, "remote_engine_id": kv.agent.name,
                             "expires_in_s": granted.expires_in_s})

    @app.post("/kv/release")
    async def release(http: Request):
        service()
        req = await read_request(http, ReleaseRequest, state.frontend, state.renderer.run, BODY_SLACK_BYTES)
        released = await state.engine_client.release_lease(req.lease_id)
        if released is None:
            raise ProtocolError(f"lease {echo(repr(req.lease_id))} is unknown, already released or expired", 404,
                                param="lease_id")
        return JSONResponse({"released_blocks": released})

    @app.post("/kv/peers")
    async def peers(http: Request):
        kv = service()
        req = await read_request(http, PeersRequest, state.frontend, state.renderer.run)
        try:
            registered = kv.registry.replace([(p.replica_id, p.url) for p in req.peers], req.router_id or "",
                                             req.ttl_s)
        except ValueError as e:
            raise ProtocolError(str(e), param="peers") from None
        return JSONResponse({"peers": registered, "routers": kv.registry.num_routers})
