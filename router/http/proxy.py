"""Forwarding one OpenAI request: validate, tokenize, route, proxy (streaming passed through).

A replica that fails before sending its first byte (refused connection, reset, 5xx) is excluded
and the request goes to the next choice, up to ``max_attempts`` replicas; a refused connection
also marks the replica unhealthy. Once bytes flow they go to the client (relay.py), and a stream
that breaks then goes on from another replica (migration.py). A client that disconnects before its
answer cancels the upstream request (the replica sees the connection close and aborts it). The body
goes with the token ids the router computed where the upstream takes them (router/http/token_forwarding.py:
tokenize once), else as sent; a stream's asks for ``"return_token_ids": true``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

from kvmesh.replica.openai import protocol as p
from kvmesh.replica.openai.body import parse_off_loop
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.messages import Request, Response
from kvmesh.router.http.migration import MigratingStream
from kvmesh.router.http.relay import UPSTREAM_ERRORS as _UPSTREAM_ERRORS
from kvmesh.router.http.relay import StreamRelay, let_go
from kvmesh.router.http.token_forwarding import TEXT, UpstreamBody
from kvmesh.router.http.upstream import UpstreamConnectError, UpstreamResponse
from kvmesh.router.routing.kv_router import RouteDecision
from kvmesh.router.routing.policies import NoReplicaError
from kvmesh.router.routing.receipts import HEADER_OPT_IN

access_log = logging.getLogger("kvmesh.router.access")
"""One JSON line per request with its route receipt (``router.access_log``)."""
SESSION_HEADER = b"x-session-id"
"""Request header naming a conversation/agent session (else the body's ``user``): soft affinity."""
HEADER_OPT_IN_BYTES = HEADER_OPT_IN.encode()
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


class Forwarder:
    """The /v1/completions and /v1/chat/completions handlers of the router."""

    def __init__(self, runtime: RouterRuntime) -> None:
        self.runtime = runtime
        self.relay = StreamRelay(self)
        """Relays streams and migrates them when their replica fails mid-way (relay.py)."""

    # ---------------------------------------------------------------- request -> token ids
    async def parse(self, raw: bytes, chat: bool) -> tuple[Any, list[int]]:
        """Validate the body and render its prompts exactly as the replica will (ProtocolError on bad input);
        the token ids to route by (a batch of prompts goes to one replica, by its first prompt)."""
        req, prompts = await self.parse_prompts(raw, chat)
        return req, prompts[0] if prompts else []

    async def parse_prompts(self, raw: bytes, chat: bool) -> tuple[Any, list[list[int]]]:
        """``parse``, with the token ids of every prompt of the request (none without a tokenizer)."""
        svc = self.runtime
        req = await parse_off_loop(raw, p.ChatCompletionRequest if chat else p.CompletionRequest, svc.renderer.run)
        svc.check_model(req.model)
        if svc.tokenizer is None:  # no tokenizer configured: load-only routing, the replica validates
            return req, []
        if chat:
            prompts = [await svc.renderer.request(req)]
        else:  # a batch of prompts is routed by its first; every prompt is checked, as the replica does
            prompts = [await svc.renderer.completion(prompt) for prompt in req.prompts()]
        for ids in prompts:
            req.to_sampling_params(len(ids), svc.tokenizer.max_model_len)  # context / max_tokens / sampling checks
        return req, prompts

    # ---------------------------------------------------------------- proxy
    async def handle(self, http: Request, path: str, chat: bool) -> Response:
        """Answer one request (the lean server's ``Request``, router/http/). A client that disconnects
        cancels this coroutine (the server does), which closes the upstream connection."""
        raw = await http.body()
        t0 = time.perf_counter_ns()
        req, prompts = await self.parse_prompts(raw, chat)
        tokenize_ns = time.perf_counter_ns() - t0
        session_id = http.header(SESSION_HEADER) or getattr(req, "user", None)
        receipt = http.header(HEADER_OPT_IN_BYTES) is not None
        body = UpstreamBody(raw, req, prompts, chat, self.runtime.config.forward_token_ids)
        ids = prompts[0] if prompts else []
        return await self._forward(path, body, req, ids, tokenize_ns, session_id, receipt)

    async def _forward(self, path: str, body: UpstreamBody, req: Any, ids: list[int], tokenize_ns: int,
                       session_id: str | None = None, receipt: bool = False) -> Response:
        svc = self.runtime
        stream = None
        if req.stream:
            stream = MigratingStream(req, path.endswith("/chat/completions"), ids, svc.tokenizer,
                                     svc.config.migration_limit)
            if svc.config.migration_limit and not req.return_token_ids:
                body.ask_for_token_ids()
        upstream, first, rest, decision = await self.dispatch(path, body, ids, req.cache_salt, [], tokenize_ns,
                                                              session_id)
        response = await self._finish(upstream, first, rest, decision, stream)
        if receipt:
            response.headers.update(decision.receipt.headers())
        return response

    async def dispatch(self, path: str, body: UpstreamBody, ids: list[int], salt: str | None, tried: list[str],
                       tokenize_ns: int | None = None, session_id: str | None = None):
        """Open the request on the best replica not ``tried``, moving on when one fails before its first byte:
        (response, first bytes, rest, decision); the response is the last attempt's 5xx if all failed so.
        Each replica gets ``body`` in the form it takes (with the router's token ids where it can)."""
        svc, router = self.runtime, self.runtime.router
        headers = {"content-type": "application/json", **svc.headers()}
        for attempt in range(svc.config.max_attempts):
            try:
                decision = router.route(ids, salt, exclude=tried, session_id=session_id)
            except NoReplicaError as e:
                raise ProtocolError(str(e), 503) from None
            if attempt == 0 and tokenize_ns is not None:
                svc.metrics.observe_stages(tokenize_ns, decision.timings_ns)
            rid = decision.replica_id
            spec = svc.specs.get(rid)
            if spec is None:  # removed meanwhile
                tried.append(rid)
                continue
            router.loads.on_dispatch(rid, decision.uncached_tokens)
            try:
                upstream, first, rest = await self._open(spec.url, path, body.for_kind(
                    svc.upstream_kinds.get(rid, TEXT)), headers)
            except asyncio.CancelledError:  # the client left: nothing reached it
                router.loads.on_finish(rid, decision.uncached_tokens, had_output=False)
                raise
            failed = isinstance(upstream, Exception)
            if failed or upstream.status >= 500:
                if not failed and attempt + 1 == svc.config.max_attempts:  # pass the last error through
                    router.loads.on_first_output(rid, decision.uncached_tokens)
                    return upstream, first, rest, decision
                router.loads.on_finish(rid, decision.uncached_tokens, had_output=False)
                if failed:
                    svc.mark_failed(rid, isinstance(upstream, UpstreamConnectError))
                else:
                    upstream.close()
                svc.metrics.child(svc.metrics.retries, str(rid)).inc()
                tried.append(rid)
                continue
            router.loads.on_first_output(rid, decision.uncached_tokens)
            self._count_decision(decision, len(ids))
            return upstream, first, rest, decision
        raise ProtocolError(f"no replica answered after {len(tried)} attempts ({', '.join(map(str, tried))}); "
                            "retry later", 503)

    async def _open(self, url: str, path: str, raw: bytes, headers: dict):
        """Send the request and wait for the first body bytes: (response or error, first bytes, rest)."""
        try:
            upstream = await self.runtime.pool.post(url, path, raw, headers)
        except _UPSTREAM_ERRORS as e:
            return e, b"", None
        body = upstream
        try:
            first = await body.__anext__()
        except StopAsyncIteration:
            first = b""
        except _UPSTREAM_ERRORS as e:
            upstream.close()
            return e, b"", None
        except BaseException:  # cancelled: close the connection so the replica aborts the request
            upstream.close()
            raise
        return upstream, first, body

    def _count_decision(self, decision: RouteDecision, prompt_tokens: int) -> None:
        m, rid = self.runtime.metrics, str(decision.replica_id)
        m.child(m.decisions, rid, self.runtime.router.policy_name).inc()
        m.child(m.predicted_hit_tokens, rid).inc(decision.predicted_hit_tokens)
        m.child(m.prompt_tokens, rid).inc(prompt_tokens)
        self.runtime.receipt_metrics.on_route(decision.receipt)

    def report_cached(self, decision: RouteDecision, chunk: bytes) -> None:
        """Count the cached tokens a replica reported in ``chunk`` (usage), against the route's receipt."""
        if b"cached_tokens" in chunk:
            found = _CACHED.findall(chunk)
            if found:
                svc, cached = self.runtime, int(found[-1])
                svc.metrics.child(svc.metrics.reported_cached_tokens, str(decision.replica_id)).inc(cached)
                receipt = svc.router.receipts.record_actual(decision.receipt, cached)
                svc.receipt_metrics.on_actual(receipt)
                if svc.config.access_log:
                    access_log.info("%s", json.dumps(receipt.log_fields()))

    async def _finish(self, upstream: UpstreamResponse, first: bytes, body, decision: RouteDecision,
                      stream: MigratingStream | None) -> Response:
        rid, loads = decision.replica_id, self.runtime.router.loads
        media = upstream.headers.get("content-type", "application/json")
        status = upstream.status
        if stream is not None and status == 200:
            return Response(stream=self.relay.relay(upstream, first, body, decision, stream), status=status,
                            media_type=media)
        complete = False
        try:
            rest = [chunk async for chunk in body]
            complete = True
        except _UPSTREAM_ERRORS as e:  # counted as a 5xx by the error handler
            raise ProtocolError(f"replica {rid} failed while answering: {e!r}; retry the request", 502) from None
        finally:
            let_go(upstream, complete)
            loads.on_finish(rid, decision.uncached_tokens, had_output=True)
        m = self.runtime.metrics
        m.child(m.requests, f"{status // 100}xx").inc()
        content = first + b"".join(rest)
        self.report_cached(decision, content)
        return Response(content, status, media)
