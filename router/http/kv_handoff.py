"""Moving a request's KV between replicas, the data plane's half (router/routing/kv_placement.py decides).

    prepare(request, decision)   before the first attempt: the P/D split (the prefill call) or a peer pull,
                                 as ``request.kv_transfer_params`` for the decode replica (vLLM's field name)
    abandon(request)             that attempt failed before its first byte: the next replica gets the request
                                 as the client sent it; a prefill replica's lease is released
    opened(decision, upstream)   the answer's ``x-kvmesh-kv-pulled-tokens`` onto the receipt and the metrics

**The split.** The prompt goes to the prefill replica as a token-id completion with ``max_tokens=1``,
``stream: false`` and ``kv_transfer_params: {"do_remote_decode": true}``; its answer's ``kv_transfer_params``
(the handle: lease, engine, tokens; not its block ids) plus ``"remote_url"`` go to the decode replica, which asks
the prefill replica's ``/kv/lease`` for the prompt with that lease (answered only for the chain it holds) and pulls
what its own cache lacks. Every replica knows the others as its pull peers (router/control/kv_peers.py). The prefill
call is held to the router's deadlines (``first_byte_timeout_s``,
``stream_idle_timeout_s``: router/replicas/patience.py) and counts towards its replica's ejection like any
answer (router/http/failures.py); whatever goes wrong, the decode replica gets the request unchanged and
computes the prompt itself, so no request fails because of a split.

**A peer pull** is only the field ``{"do_remote_prefill": true, "remote_url": <holder>}``: the replica
leases the blocks from the holder itself, and computes the prompt if the pull fails.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from kvmesh.router.http.caller import schedules_by_priority
from kvmesh.router.http.failures import InvalidAnswer, count_failure
from kvmesh.router.http.relay import UPSTREAM_ERRORS
from kvmesh.router.routing.kv_placement import SPLIT_OK, SPLIT_PREFILL_FAILED, tokens_left_after_split
from kvmesh.router.routing.model_pools import AdapterLoadError
from kvmesh.router.routing.receipts import HEADER_PULLED_TOKENS

if TYPE_CHECKING:
    from kvmesh.router.http.data_plane import DataPlane
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.upstream import UpstreamResponse
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import RouteDecision

logger = logging.getLogger(__name__)

TRANSFER_FIELD = "kv_transfer_params"
"""The request and response field of a transfer (vLLM's NixlConnector's name)."""
HANDLE_KEYS = ("remote_lease_id", "remote_engine_id", "num_tokens")
"""What of the prefill replica's handle goes on to the decode replica (with ``remote_url``)."""


class KVHandoff:
    """See the module doc; one per ``Forwarder``."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self._releases: set[asyncio.Task] = set()

    async def prepare(self, request: ProxyRequest, decision: RouteDecision) -> None:
        """Set ``request.kv_transfer_params`` for ``decision``'s replica: a split's handle, a peer pull, or none."""
        svc = self.plane
        if not request.route_ids or len(request.prompts) > 1:
            return  # no token ids to prefill by (no tokenizer), or a batch of prompts: served as sent
        choice = svc.router.choose_split(decision)
        prefill = choice.prefill
        if choice.skipped is not None:
            svc.metrics.child(svc.metrics.pd_splits, choice.skipped).inc()
            decision.receipt.kv_not_shared = choice.why or decision.receipt.kv_not_shared
        if prefill is not None:  # a split, or (its prefill call failed) the request as sent: never a pull
            handle = await self._prefill(request, decision, prefill) if not prefill.removed else None
            svc.metrics.child(svc.metrics.pd_splits, SPLIT_OK if handle is not None else SPLIT_PREFILL_FAILED).inc()
            if handle is not None:
                request.kv_transfer_params = handle
                decision.receipt.prefill_replica_id = prefill.id
                # the decode replica's load counts what it still computes, not the suffix the prefill replica did
                decision.uncached_tokens = min(decision.uncached_tokens, tokens_left_after_split(
                    len(request.route_ids), svc.router.block_size))
            return
        self.pull(request, decision)

    def may_split(self, request: ProxyRequest) -> bool:
        """Whether ``prepare`` may make a split for ``request`` (prefill replicas exist, one prompt with token ids);
        when not, ``pull`` is all it would do, and nothing waits."""
        return bool(request.route_ids) and len(request.prompts) <= 1 and self.plane.router.replicas.num_prefill > 0

    def pull(self, request: ProxyRequest, decision: RouteDecision) -> None:
        """Set ``request.kv_transfer_params`` to a peer pull when ``decision`` chose one (``prepare`` without a
        split)."""
        pull = decision.pull
        holder = pull.holder if pull is not None else None
        if holder is not None and not holder.removed and holder.spec is not None and request.route_ids \
                and len(request.prompts) <= 1:
            request.kv_transfer_params = {"do_remote_prefill": True, "remote_url": holder.spec.url}
            decision.receipt.pulled_from = holder.id
            self.plane.metrics.peer_pulls.inc()

    async def _prefill(self, request: ProxyRequest, decision: RouteDecision, prefill: Replica) -> dict | None:
        """The prefill call; the handle for the decode replica, or None (counted against the prefill replica
        when it failed as a replica fails)."""
        svc, spec, prefill_id = self.plane, prefill.spec, prefill.id
        if spec is None:
            return None
        try:  # an adapter's prompt is prefilled with the adapter: the prefill replica loads it first
            await svc.ensure_adapter(prefill, request.model_pool)
        except AdapterLoadError as e:
            logger.info("prefill replica %s: %s; the decode replica computes the prompt", prefill_id, e)
            return None
        body: dict[str, object] = {"prompt": request.route_ids, "max_tokens": 1, "stream": False,
                                   TRANSFER_FIELD: {"do_remote_decode": True}}
        if request.req is not None and request.req.model is not None:
            body["model"] = request.req.model
        if request.salt is not None:
            body["cache_salt"] = request.salt
        if schedules_by_priority(prefill):  # the prefill replica schedules it by the granted one too
            body["priority"] = request.priority or 0
        headers = {"content-type": "application/json", **svc.headers}
        loads, uncached = svc.router.loads, decision.uncached_tokens
        loads.on_dispatch(prefill, uncached)
        try:
            upstream = await svc.pool.post(spec.url, "/v1/completions", msgspec.json.encode(body), headers,
                                           svc.failures.patience(prefill))
            try:
                raw = await upstream.read()
            except BaseException:
                upstream.close()
                raise
            upstream.release()
        except UPSTREAM_ERRORS as e:
            why = count_failure(svc.failures, prefill, e)
            logger.info("prefill replica %s failed (%s); the decode replica computes the prompt", prefill_id, why)
            return None
        finally:
            loads.on_finish(prefill, uncached, had_output=False)
        return self._handle(prefill, spec.url, upstream.status, raw)

    def _handle(self, prefill: Replica, url: str, status: int, raw: bytes) -> dict | None:
        """The decode replica's ``kv_transfer_params`` from the prefill replica's answer, or None."""
        failures, prefill_id = self.plane.failures, prefill.id
        if status >= 500:
            failures.record_failure(prefill, f"answered HTTP {status}", "http_5xx")
            return None
        if status != 200:
            logger.warning("prefill replica %s answered HTTP %d: %s", prefill_id, status, raw[:200])
            return None
        try:
            answer = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            count_failure(failures, prefill, InvalidAnswer(f"answered 200 with a body that is not JSON ({e})"))
            return None
        failures.outliers.on_success(prefill)
        handle = answer.get(TRANSFER_FIELD) if isinstance(answer, dict) else None
        if not isinstance(handle, dict):
            logger.warning("prefill replica %s answered without %s (is KV transfer on there?)", prefill_id,
                           TRANSFER_FIELD)
            return None
        # the decode replica asks the prefill replica's /kv/lease for this prompt, showing the lease: block ids
        # are never passed along (a puller reads only what the holder answers for the prompt's own chain)
        return {"do_remote_prefill": True, "remote_url": url,
                **{key: handle[key] for key in HANDLE_KEYS if key in handle}}

    def abandon(self, request: ProxyRequest) -> None:
        """The attempt carrying ``request.kv_transfer_params`` failed: forget them, release a split's lease."""
        params, request.kv_transfer_params = request.kv_transfer_params, None
        lease = params.get("remote_lease_id") if params else None
        if lease and isinstance(params.get("remote_url"), str):
            task = asyncio.ensure_future(self._release(params["remote_url"], lease))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _release(self, url: str, lease_id: str) -> None:
        """``POST /kv/release`` (best effort: an unknown lease, already released by its puller, is a 404)."""
        svc = self.plane
        headers = {"content-type": "application/json", **svc.headers}
        try:
            await svc.pool.fetch("POST", url, "/kv/release", svc.config.upstream.connect_timeout_s,
                                 msgspec.json.encode({"lease_id": lease_id}), headers)
        except (*UPSTREAM_ERRORS, ValueError):
            pass  # the lease expires on its own

    def opened(self, decision: RouteDecision, upstream: UpstreamResponse) -> None:
        """Read the tokens the replica pulled (its ``x-kvmesh-kv-pulled-tokens``) into the receipt and metrics."""
        value = upstream.headers.get(HEADER_PULLED_TOKENS)
        if value is None:
            return
        try:
            pulled = max(0, int(value))
        except ValueError:
            return
        decision.receipt.kv_pulled_tokens = pulled
        if pulled:
            self.plane.metrics.kv_pulled_tokens.inc(pulled)

