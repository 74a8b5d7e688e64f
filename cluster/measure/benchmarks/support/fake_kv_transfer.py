"""The fake replica's side of the P/D and peer-pull contract, over real HTTP, without moving bytes.

What a router sees is the contract's: ``POST /kv/lease`` (the prompt's leading full blocks this replica's prefix
cache holds, held under a lease id; with ``lease_id``, that lease for the prompt it holds, else a 409),
``POST /kv/release`` (404 for an unknown lease), ``POST /kv/peers`` (each router's replica set, kept per router as a
real replica keeps them: the only URLs this replica pulls from), ``GET /kv/handshake`` (503 while transfer is off),
``/load``'s ``kv_transfer`` object, and
``kv_transfer_params`` on completions:

- ``{"do_remote_decode": true}`` (prefill side): the prompt goes through the cache, then its blocks are leased and
  the answer carries the handle (``do_remote_prefill``, ``remote_block_ids``, ``remote_lease_id``,
  ``remote_engine_id``, ``num_tokens``);
- ``{"do_remote_prefill": true, "remote_url": ...}`` (decode side or peer pull): a ``remote_url`` that is no
  registered peer's is skipped without a call; else it asks ``remote_url``'s ``/kv/lease`` for the prompt (showing
  ``remote_lease_id`` when given; block ids on the wire are never read), counts the leased tokens its own cache
  lacks as pulled, always releases, and answers with ``x-kvmesh-kv-pulled-tokens`` / ``-bytes`` and
  ``x-kvmesh-kv-pull: ok|failed|skipped``; a peer that is down, errs, refuses or times out is a failed pull
  (0 tokens) and the request is served anyway.

Every ``kv_transfer_params`` received is kept (``/fake/stats``: ``kv_transfer_params``) so tests can read what
the router sent where.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kvmesh.replica.server.kv_peers import PeerRegistry

if TYPE_CHECKING:
    from kvmesh.cluster.measure.benchmarks.support.prefix_cache import PrefixCache

JSONBody = dict[str, object]
PULL_TIMEOUT_S = 5.0
"""Seconds a pull's lease and release calls may take before the pull counts as failed."""


class BadTransferParams(ValueError):
    """``kv_transfer_params`` that is not what the contract allows: a 400 naming the field."""


async def post_json(url: str, path: str, body: JSONBody, auth: str) -> tuple[int, JSONBody]:
    """One ``POST`` of JSON to ``url`` (stdlib, ``Connection: close``): its status and JSON body."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port or 80)
    try:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n"
                + (f"Authorization: {auth}\r\n" if auth else "") + "\r\n")
        writer.write(head.encode() + data)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    answer = json.loads(payload) if payload.strip() else {}
    return int(status_line.split()[1]), answer if isinstance(answer, dict) else {}


FAKE_LAYOUT: JSONBody = {"model": "fake", "dtype": "bfloat16", "block_size": 16, "scales_digest": "",
                         "cache_layout": "L,2,H,blocks,B,D", "tp_size": 1, "transport": "nixl"}
"""``/load``'s ``kv_transfer.layout`` of a fake replica unless configured: every fake's is the same."""


class FakeKVTransfer:
    """Leases, handles and pulls of one fake replica (see the module doc)."""

    def __init__(self, name: str, cache: PrefixCache | None) -> None:
        self.name = name
        self.cache = cache
        self.enabled = False
        """``/load``'s ``kv_transfer.enabled`` (``POST /fake/config {"kv_transfer": {...}}`` sets it)."""
        self.pull_bytes_per_s: float | None = None
        self.bytes_per_token = 64
        self.layout: object = FAKE_LAYOUT
        """``/load``'s ``kv_transfer.layout``, as configured (any JSON: a test plays a hostile replica with it)."""
        self.refuse_peers = 0
        """How many of the next ``POST /kv/peers`` answer 503 (a registration that does not land)."""
        self.leases: dict[str, tuple[int, list[int], str | None]] = {}
        """Lease id -> (blocks held, the prompt's token ids they hold, its salt)."""
        self.registry = PeerRegistry()
        """The registered peers, per router, as a real replica keeps them (``POST /kv/peers``)."""
        self.registrations: list[JSONBody] = []
        """Every ``POST /kv/peers`` body's ``router_id`` and ``ttl_s``, in order."""
        self.released = 0
        self.received: list[JSONBody] = []
        """Every ``kv_transfer_params`` received on a completion, in order."""
        self._ids = itertools.count(1)

    def configure(self, body: object) -> None:
        if isinstance(body, dict):
            self.enabled = bool(body.get("enabled", self.enabled))
            self.pull_bytes_per_s = body.get("pull_bytes_per_s", self.pull_bytes_per_s)
            self.bytes_per_token = int(body.get("bytes_per_token", self.bytes_per_token))
            self.refuse_peers = int(body.get("refuse_peers", 0))
            self.layout = body.get("layout", self.layout)

    def reset(self) -> None:
        self.received.clear()
        self.leases.clear()
        self.released = 0
        self.registry = PeerRegistry()
        self.registrations.clear()

    def load_field(self) -> JSONBody:
        """``/load``'s ``kv_transfer`` object."""
        return {"enabled": self.enabled, "pull_bytes_per_s": self.pull_bytes_per_s,
                "bytes_per_token": self.bytes_per_token if self.enabled else None,
                "registered_peers": self.registry.num_registered if self.enabled else None,
                "layout": self.layout if self.enabled else None}

    def stats(self) -> JSONBody:
        return {"kv_transfer_params": list(self.received), "leases_active": len(self.leases),
                "leases_released": self.released, "kv_peers": sorted(self.registry.urls()),
                "kv_peer_registrations": list(self.registrations)}

    @staticmethod
    def params_of(body: JSONBody) -> JSONBody | None:
        """The body's ``kv_transfer_params`` (None: absent); BadTransferParams when it is not an object."""
        params = body.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise BadTransferParams(f"kv_transfer_params must be an object, got {type(params).__name__}")
        return params

    # ---------------------------------------------------------------- holder side
    def lease(self, body: JSONBody) -> tuple[int, JSONBody]:
        """``POST /kv/lease``: the prompt's leading full blocks held here, under a new lease ("" when none); with
        ``lease_id``, that lease when it holds this prompt's leading tokens (409 otherwise, 404 unknown)."""
        ids, salt = body.get("prompt_token_ids"), body.get("cache_salt")
        ids = ids if isinstance(ids, list) else []
        if body.get("lease_id") is not None:
            held = self.leases.get(str(body["lease_id"]))
            if held is None:
                return 404, _error(f"no lease {body['lease_id']!r}", 404)
            blocks, tokens, held_salt = held
            if held_salt != salt or ids[:len(tokens)] != tokens:
                return 409, _error(f"lease {body['lease_id']!r} does not hold this prompt's blocks", 409)
            return 200, self._answer(str(body["lease_id"]), blocks)
        held_tokens = self.cache.held_tokens(ids, salt) if self.cache is not None else 0
        blocks = held_tokens // self.cache.manager.block_size if held_tokens else 0
        lease_id = f"{self.name}-lease-{next(self._ids)}" if blocks else ""
        if blocks:
            self.leases[lease_id] = (blocks, ids[:held_tokens], salt)
        return 200, self._answer(lease_id, blocks)

    def _answer(self, lease_id: str, blocks: int) -> JSONBody:
        size = self.cache.manager.block_size if self.cache is not None else 1
        return {"lease_id": lease_id, "remote_block_ids": list(range(1, blocks + 1)), "num_tokens": blocks * size,
                "remote_engine_id": self.name, "expires_in_s": 30.0}

    def register(self, body: JSONBody) -> tuple[int, JSONBody]:
        """``POST /kv/peers``: a router's replica set replaces that router's last one (replica/server/kv_peers.py)."""
        peers = body.get("peers")
        if not isinstance(peers, list) or not all(isinstance(p, dict) and isinstance(p.get("url"), str) for p in peers):
            return 400, _error("peers must be a list of {replica_id, url}", 400)
        if self.refuse_peers > 0:
            self.refuse_peers -= 1
            return 503, _error("refusing peer registrations (fake config refuse_peers)", 503)
        self.registrations.append({"router_id": body.get("router_id"), "ttl_s": body.get("ttl_s")})
        try:
            registered = self.registry.replace([(str(p.get("replica_id")), p["url"]) for p in peers],
                                               str(body.get("router_id") or ""), body.get("ttl_s"))
        except ValueError as e:
            return 400, _error(str(e), 400)
        return 200, {"peers": registered, "routers": self.registry.num_routers}

    def release(self, body: JSONBody) -> tuple[int, JSONBody]:
        """``POST /kv/release``: 200 with the blocks let go, 404 for an unknown lease."""
        held = self.leases.pop(str(body.get("lease_id")), None)
        if held is None:
            return 404, _error(f"no lease {body.get('lease_id')!r}", 404)
        self.released += 1
        return 200, {"released_blocks": held[0]}

    def handle(self, ids: list[int], salt: str | None) -> JSONBody:
        """A prefill's answer field: the prompt's blocks leased for the decode replica."""
        _, lease = self.lease({"prompt_token_ids": ids, "cache_salt": salt})
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": lease["remote_block_ids"],
                "remote_lease_id": lease["lease_id"], "remote_engine_id": self.name,
                "num_tokens": lease["num_tokens"]}

    # ---------------------------------------------------------------- puller side
    async def pull(self, params: JSONBody, ids: list[int], salt: str | None, auth: str) -> tuple[int, str]:
        """(tokens pulled, outcome) for a ``do_remote_prefill`` request: what the remote holds beyond this cache."""
        url = params.get("remote_url")
        if not isinstance(url, str):
            raise BadTransferParams("kv_transfer_params.remote_url must be the holder's http://HOST:PORT")
        if self.registry.resolve(url) is None:
            return 0, "skipped"  # not a registered peer: no call at all
        own = self.cache.held_tokens(ids, salt) if self.cache is not None else 0
        lease_id = params.get("remote_lease_id") or None
        ask = {"prompt_token_ids": ids, "cache_salt": salt, **({"lease_id": lease_id} if lease_id else {})}
        try:
            status, lease = await asyncio.wait_for(post_json(url, "/kv/lease", ask, auth), PULL_TIMEOUT_S)
            if status != 200:
                return 0, "failed"
            lease_id, remote = lease.get("lease_id") or lease_id, int(lease.get("num_tokens", 0))
        except (OSError, asyncio.TimeoutError, ValueError):
            return 0, "failed"
        finally:
            if lease_id:
                await self._release(url, lease_id, auth)
        return max(0, remote - own), "ok" if remote > own else "skipped"

    @staticmethod
    async def _release(url: str, lease_id: object, auth: str) -> None:
        try:
            await asyncio.wait_for(post_json(url, "/kv/release", {"lease_id": lease_id}, auth), PULL_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ValueError):
            pass  # the holder's lease expires on its own


def _error(message: str, status: int) -> JSONBody:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}}


def with_headers(head: bytes, headers: dict[str, str]) -> bytes:
    """An answer's bytes with ``headers`` added to its HTTP head."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    end = head.index(b"\r\n\r\n")
    return head[:end + 2] + extra + head[end + 2:]
