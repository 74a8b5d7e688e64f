"""The replica's KV transfer front: its agent, its registered peers, pulls over HTTP, stats.

    decode side (kv_transfer_params.do_remote_prefill): a ``PeerLoad`` rides with the request into the engine's
    scheduler (engine/remote_kv.py, engine/remote_loads.py), which asks it, on this server's loop:
        remote_url a registered peer's?    (kv_peers.py) else skipped: no HTTP call at all, the prompt computed
        POST {remote_url}/kv/lease         {"prompt_token_ids", "cache_salt", "lease_id"?: remote_lease_id}: the
                                           block ids read come only from this answer, for this prompt's chain
        GET  {remote_url}/kv/handshake     once per peer (cached; fetched again after a failure)
      the engine reads the blocks this replica lacks between its steps (the request waits), then tells it the end:
        POST {remote_url}/kv/release       always when a lease is known, success or failure
    prefill side (do_remote_decode): the engine's connector leases the prompt's blocks as the request finishes,
                                     for the caller's peer identity; its final output carries the handle.

Every /kv/* call carries ``x-kvmesh-replica-id`` (the holder's lease caps count per peer). ``remote_block_ids``
and ``remote_block_media`` in ``kv_transfer_params`` are informational (vLLM sends them): never read.
Any failure (peer dead, an HTTP error or refusal, a timeout, a layout mismatch, no room) ends as
``PullResult("failed")`` and the request computes the prompt: it never fails because of a transfer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import TYPE_CHECKING

from kvmesh.replica.engine.remote_kv import PullResult, RemoteBlocks, RemoteKV
from kvmesh.replica.kv_transfer.agent import KVTransferAgent, block_bytes, decode_handshake, encode_handshake
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.kv_transfer_params import KVTransferParams
from kvmesh.replica.server.kv_metrics import KVTransferMetrics
from kvmesh.replica.server.kv_peers import REPLICA_ID_HEADER, PeerRegistry
from kvmesh.replica.serving.load_report import KVLayoutInfo, KVTransferLoad

if TYPE_CHECKING:
    import aiohttp
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.serving.lora_request import LoRARequest

logger = logging.getLogger(__name__)


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
                 metrics: KVTransferMetrics, replica_id: str, model_name: str | None = None) -> None:
        """``model_name``: the served name ``/load``'s layout says (None: the engine's model)."""
        self.config, self.agent, self.engine, self.metrics = config, agent, engine, metrics
        self.replica_id = replica_id
        self.registry = PeerRegistry(config.peers)
        """Whom this replica may pull from (``POST /kv/peers`` and ``--kv-peer``)."""
        self.block_size = engine.block_size
        self.bytes_per_block = block_bytes(agent)  # every tensor-parallel rank's share
        self._handshake = encode_handshake(agent.handshake())
        self.layout = layout_info(agent, model_name or engine.config.model)
        """What a peer's KV must match (``/load``'s ``kv_transfer.layout``; the handshake compares the same)."""
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
                              registered_peers=self.registry.num_registered, layout=self.layout)

    def lease_ttl_s(self, asked: float | None) -> float:
        """The TTL of a lease asked with ``ttl_s`` ``asked``: the default, clamped to ``max_lease_ttl_s``."""
        return min(self.config.lease_ttl_s if asked is None else asked, self.config.max_lease_ttl_s)

    # ------------------------------------------------------------ a request's transfer
    def request_params(self, params: KVTransferParams, prompt: list[int], cache_salt: str | None,
                       authorization: str | None, lora: LoRARequest | None, peer: str) -> RemoteKV | None:
        """What the engine takes of a checked request's ``kv_transfer_params``: the decode side's pull (a
        ``PeerLoad`` of ``prompt``, asked with ``authorization``, run with adapter ``lora``: the holder hashes with
        this replica's identity of its weights), the prefill side's lease for ``peer`` (its cap); None: neither."""
        if params.do_remote_prefill:
            return RemoteKV(remote=PeerLoad(self, asyncio.get_running_loop(), params, prompt, cache_salt,
                                                     authorization, lora))
        if params.do_remote_decode:
            return RemoteKV(lease_ttl_s=self.config.lease_ttl_s, peer=peer, engine_id=self.agent.name)
        return None

    # ------------------------------------------------------------ puller side
    async def lookup(self, load: PeerLoad) -> RemoteBlocks | PullResult:
        """Ask the holder at ``remote_url`` for the prompt's blocks (its /kv/lease, with the handle's lease when
        there is one) and shake hands with it: the blocks to read, or the outcome without a read; never raises."""
        url = load.url = self.registry.resolve(load.params.remote_url or "")
        if url is None:
            logger.warning("KV pull skipped: %r is not a registered peer (POST /kv/peers, --kv-peer); computing "
                           "the prompt", load.params.remote_url)
            return PullResult("skipped")
        lease_id = load.lease_id = load.params.remote_lease_id or None  # a P/D handle's: shown for this chain only
        try:
            ask = {"prompt_token_ids": load.prompt, "cache_salt": load.cache_salt,
                   **({"lease_id": lease_id} if lease_id else {}), **load.lora_fields()}
            lease = await self._call("POST", f"{url}/kv/lease", load.headers, ask)
            block_ids, load.lease_id = list(lease["remote_block_ids"]), lease["lease_id"] or lease_id
            if not block_ids:
                return PullResult("skipped")
            peer = await self._peer(url, load.headers)
        except Exception as e:  # noqa: BLE001 - any failure: the prompt is computed here
            await self._failed(url, e)
            return PullResult("failed")
        # remote_block_media is absent from a holder without tiers: all on its device
        return RemoteBlocks(self.agent, peer, block_ids, lease.get("remote_block_media"))

    async def finish(self, load: PeerLoad, result: PullResult, error: BaseException | None) -> None:
        """A pull ended: the holder's lease let go (success or failure), the pull counted."""
        if error is not None and load.url is not None:
            await self._failed(load.url, error)
        if load.lease_id and load.url is not None:
            await self._release(load.url, load.headers, load.lease_id)
        self._count(result, load.t0)

    async def _failed(self, url: str, e: BaseException) -> None:
        if not (isinstance(e, PeerError) and e.status in REFUSALS):  # a refusal: the peer itself is fine
            await self._forget(url)
        logger.warning("KV pull from %s failed (%s: %s); computing the prompt", url, type(e).__name__, e)

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


def layout_info(agent: KVTransferAgent, model: str) -> KVLayoutInfo:
    """What a router compares before it pairs this replica with another (the fields the handshake checks)."""
    layout = agent.layout
    return KVLayoutInfo(model=model, dtype=layout.dtype, block_size=layout.block_size,
                        scales_digest=layout.scales_digest, cache_layout=layout.kv_layout, tp_size=agent.tp_size,
                        transport=agent.config.transport)


class PeerLoad:
    """One request's pull from a peer (a ``RemoteSource``, engine/remote_kv.py): the engine thread
    starts its lookup and reports its end; both run on the server's loop."""

    def __init__(self, service: KVTransferService, loop: asyncio.AbstractEventLoop, params: KVTransferParams,
                 prompt: list[int], cache_salt: str | None, authorization: str | None,
                 lora: LoRARequest | None) -> None:
        self.service, self.loop, self.params, self.prompt, self.cache_salt = service, loop, params, prompt, cache_salt
        self.lora = lora
        self.headers = {REPLICA_ID_HEADER: service.replica_id,
                        **({"Authorization": authorization} if authorization else {})}
        self.url: str | None = None
        self.lease_id: str | None = None
        self.t0 = time.monotonic()
        self._lookup: concurrent.futures.Future | None = None
        self._finished: concurrent.futures.Future | None = None

    def lora_fields(self) -> dict:
        if self.lora is None:
            return {}
        return {"lora_name": self.lora.lora_name,
                **({"lora_identity": self.lora.identity} if self.lora.identity else {})}

    def lookup(self) -> concurrent.futures.Future[RemoteBlocks | PullResult]:
        self.t0 = time.monotonic()
        self._lookup = asyncio.run_coroutine_threadsafe(self.service.lookup(self), self.loop)
        return self._lookup

    def done(self, result: PullResult, error: BaseException | None = None) -> None:
        coro = self._finish(result, error)
        try:
            self._finished = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the server's loop is gone (shutting down): the holder's lease expires there
            coro.close()

    async def ended(self) -> None:
        """Wait until the end the engine reported is done (the holder's lease let go): the answer follows it."""
        if self._finished is not None:
            await asyncio.wait([asyncio.wrap_future(self._finished)])

    async def _finish(self, result: PullResult, error: BaseException | None) -> None:
        if self._lookup is not None:  # an aborted request's lookup may still be asking: its lease is known after
            await asyncio.wait([asyncio.wrap_future(self._lookup)])
        await self.service.finish(self, result, error)
