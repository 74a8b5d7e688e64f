"""The replica's KV transfer front: its agent, its registered peers, pulls over HTTP, stats.

    decode side (kv_transfer_params.do_remote_prefill):
        remote_url a registered peer's?    (kv_peers.py) else skipped: no HTTP call at all, the prompt computed
        POST {remote_url}/kv/lease         {"prompt_token_ids", "cache_salt", "lease_id"?: remote_lease_id}: the
                                           block ids read come only from this answer, for this prompt's chain
        GET  {remote_url}/kv/handshake     once per peer (cached; fetched again after a failure)
        engine.pull_prefix(...)            the blocks this replica lacks, read between engine steps
        POST {remote_url}/kv/release       always when a lease is known, success or failure
    prefill side (do_remote_decode): engine.lease_at_finish(request id) armed before the request runs; the
                                     engine thread leases the prompt's blocks as it finishes -> the handle.

Every /kv/* call carries ``x-kvmesh-replica-id`` (the holder's lease caps count per peer). ``remote_block_ids``
and ``remote_block_media`` in ``kv_transfer_params`` are informational (vLLM sends them): never read.
Any failure (peer dead, an HTTP error or refusal, a timeout, a layout mismatch, no room) ends as
``PullResult("failed")`` and the caller computes the prompt: a request never fails because of a transfer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.replica.kv_transfer.agent import KVTransferAgent, block_bytes, decode_handshake, encode_handshake
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.kv_transfer_params import KVTransferParams
from kvmesh.replica.server.kv_metrics import KVTransferMetrics
from kvmesh.replica.server.kv_peers import REPLICA_ID_HEADER, PeerRegistry
from kvmesh.replica.serving.load_report import KVTransferLoad

if TYPE_CHECKING:
    import aiohttp
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.kv_transfer.leases import Lease
    from kvmesh.replica.serving.lora_request import LoRARequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PullResult:
    """How a pull went: ``ok`` (tokens moved), ``skipped`` (nothing to move) or ``failed`` (computed instead)."""

    outcome: str
    tokens: int = 0
    bytes: int = 0

    def headers(self) -> dict[str, str]:
        """The response headers of the contract (``x-kvmesh-kv-pull`` only when a pull was tried)."""
        return {"x-kvmesh-kv-pulled-tokens": str(self.tokens), "x-kvmesh-kv-pulled-bytes": str(self.bytes),
                "x-kvmesh-kv-pull": self.outcome}


class PeerError(RuntimeError):
    """A peer's /kv/* call failed (status, body or connection); ``status`` its HTTP status, None without one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


REFUSALS = (404, 409, 413, 429)
"""A holder's answers to a lease it will not give (unknown, another chain, too big, a cap): no fault of the peer."""


class KVTransferService:
    """One replica's transfer agent (rank 0) and what its HTTP routes and completions need of it."""

    def __init__(self, config: KVTransferConfig, agent: KVTransferAgent, engine: AsyncLLM,
                 metrics: KVTransferMetrics, replica_id: str) -> None:
        self.config, self.agent, self.engine, self.metrics = config, agent, engine, metrics
        self.replica_id = replica_id
        self.registry = PeerRegistry(config.peers)
        """Whom this replica may pull from (``POST /kv/peers`` and ``--kv-peer``)."""
        self.block_size = engine.block_size
        self.bytes_per_block = block_bytes(agent)  # every tensor-parallel rank's share
        self._handshake = encode_handshake(agent.handshake())
        self._peers: dict[str, str] = {}  # remote_url -> the peer's agent name (handshake done)
        self._session: aiohttp.ClientSession | None = None
        self._handshaking: asyncio.Lock | None = None  # one handshake at a time

    # ------------------------------------------------------------ holder side
    def handshake_bytes(self) -> bytes:
        return self._handshake

    def load(self) -> KVTransferLoad:
        transfers = self.engine.kv_transfers
        return KVTransferLoad(enabled=True, pull_bytes_per_s=transfers.pull_bytes_per_s,
                              pull_fixed_s=transfers.pull_fixed_s,
                              bytes_per_token=self.bytes_per_block // self.block_size,
                              registered_peers=self.registry.num_registered)

    def lease_at_finish(self, request_id: str, peer: str) -> concurrent.futures.Future[Lease]:
        """Arm the prefill side's lease, counted against ``peer``: taken on the engine thread when ``request_id``
        finishes."""
        return self.engine.lease_at_finish(request_id, self.config.lease_ttl_s, peer)

    def lease_ttl_s(self, asked: float | None) -> float:
        """The TTL of a lease asked with ``ttl_s`` ``asked``: the default, clamped to ``max_lease_ttl_s``."""
        return min(self.config.lease_ttl_s if asked is None else asked, self.config.max_lease_ttl_s)

    async def handle(self, armed: concurrent.futures.Future[Lease]) -> dict:
        """The prefill side's answer: the lease its request took at finish, as ``kv_transfer_params``."""
        lease = await asyncio.wrap_future(armed)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": lease.remote_block_ids,
                "remote_block_media": lease.remote_block_media, "remote_lease_id": lease.lease_id,
                "remote_engine_id": self.agent.name, "num_tokens": lease.num_tokens}

    # ------------------------------------------------------------ puller side
    async def pull(self, params: KVTransferParams, prompt: list[int], cache_salt: str | None,
                   authorization: str | None, lora: LoRARequest | None = None) -> PullResult:
        """Pull what this replica lacks of ``prompt``'s prefix (run with adapter ``lora``, None: the base model; the
        holder hashes with this replica's identity of its weights) from ``params.remote_url``; never raises."""
        lora_name, identity = (lora.lora_name, lora.identity) if lora is not None else (None, None)
        t0 = time.monotonic()
        url = self.registry.resolve(params.remote_url or "")
        if url is None:
            logger.warning("KV pull skipped: %r is not a registered peer (POST /kv/peers, --kv-peer); computing "
                           "the prompt", params.remote_url)
            return self._count(PullResult("skipped"), t0)
        headers = {REPLICA_ID_HEADER: self.replica_id, **({"Authorization": authorization} if authorization else {})}
        lease_id = params.remote_lease_id or None  # a P/D handle's: shown only for this prompt's chain
        try:
            ask = {"prompt_token_ids": prompt, "cache_salt": cache_salt, **({"lease_id": lease_id} if lease_id else {}),
                   **({"lora_name": lora_name} if lora_name else {}),
                   **({"lora_identity": identity} if identity else {})}
            lease = await self._call("POST", f"{url}/kv/lease", headers, ask)
            block_ids, lease_id = list(lease["remote_block_ids"]), lease["lease_id"] or lease_id
            media = lease.get("remote_block_media")  # absent from a holder without tiers: all on its device
            if not block_ids:
                return self._count(PullResult("skipped"), t0)
            peer = await self._peer(url, headers)
            tokens = await self.engine.pull_prefix(self.agent, peer, prompt, block_ids, cache_salt, media, lora_name,
                                                   identity)
        except Exception as e:  # noqa: BLE001 - any failure: the prompt is computed here
            if not (isinstance(e, PeerError) and e.status in REFUSALS):  # a refusal: the peer itself is fine
                await self._forget(url)
            logger.warning("KV pull from %s failed (%s: %s); computing the prompt", url, type(e).__name__, e)
            result = PullResult("failed")
        else:
            result = PullResult("ok", tokens, tokens // self.block_size * self.bytes_per_block) if tokens \
                else PullResult("skipped")
        finally:
            if lease_id:
                await self._release(url, headers, lease_id)
        return self._count(result, t0)

    def _count(self, result: PullResult, t0: float) -> PullResult:
        self.metrics.record_pull(result.outcome, result.tokens, result.bytes, time.monotonic() - t0)
        return result

    async def _peer(self, url: str, headers: dict[str, str]) -> str:
        if self._handshaking is None:
            self._handshaking = asyncio.Lock()
        async with self._handshaking:  # two first requests to one peer shake hands once
            if url not in self._peers:
                raw = await self._call("GET", f"{url}/kv/handshake", headers, None, raw=True)
                # off the server's loop: nixl prepares the peer's descriptors (tens of ms), a TP agent waits on
                # every rank over Ray (up to timeout_s); KVLayoutMismatch names the fields
                self._peers[url] = await asyncio.to_thread(self.agent.add_peer, decode_handshake(raw))
        return self._peers[url]

    async def _forget(self, url: str) -> None:
        peer = self._peers.pop(url, None)
        if peer is not None:
            await asyncio.to_thread(self.agent.remove_peer, peer)

    async def _release(self, url: str, headers: dict[str, str], lease_id: str) -> None:
        try:
            await self._call("POST", f"{url}/kv/release", headers, {"lease_id": lease_id})
        except Exception as e:  # noqa: BLE001 - the lease expires on the holder anyway
            logger.info("releasing lease %s at %s failed (%s); it expires there", lease_id, url, e)

    async def _call(self, method: str, url: str, headers: dict[str, str], body: dict | None, raw: bool = False):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.timeout_s))
        try:
            async with self._session.request(method, url, json=body, headers=headers) as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise PeerError(f"{method} {url} answered {resp.status}: {data[:200]!r}", resp.status)
                return data if raw else await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise PeerError(f"{method} {url} failed: {e!r}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
