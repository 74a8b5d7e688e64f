"""Forwarding one OpenAI request: validate, tokenize, route, proxy (streaming passed through).

A replica that fails before sending its first byte (refused connection, reset, 5xx) is excluded
and the request goes to the next choice, up to ``max_attempts`` replicas; a refused connection
also marks the replica unhealthy. Once bytes flow they go straight to the client; a failure
then ends the stream with an OpenAI-shaped error event. The body is forwarded unchanged, so the
replica tokenizes it exactly as the router did.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from kvmesh.replica import protocol as p
from kvmesh.router.core import RouteDecision
from kvmesh.router.policies import NoReplicaError
from kvmesh.router.service import RouterService

_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
# Failures of the upstream connection (refused, reset, timed out, truncated).
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


class Forwarder:
    """The /v1/completions and /v1/chat/completions handlers of the router."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    # ---------------------------------------------------------------- request -> token ids
    def parse(self, raw: bytes, chat: bool) -> tuple[Any, list[int]]:
        """Validate the body and render its prompt exactly as the replica will (ProtocolError on bad input)."""
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise p.ProtocolError(f"request body is not valid JSON: {e}") from None
        req = p.parse_request(p.ChatCompletionRequest if chat else p.CompletionRequest, body)
        served = self.service.config.served_model_name
        if served is not None and req.model not in (None, served):
            raise p.ProtocolError(f"model {req.model!r} does not exist; this router serves {served!r}", 404,
                                  param="model")
        tok = self.service.tokenizer
        if tok is None:  # no tokenizer configured: load-only routing, the replica validates
            return req, []
        try:
            if chat:
                ids = tok.render_chat(req.template_messages(), req.add_generation_prompt, req.chat_template)
            else:
                ids = tok.render_completion(req.single_prompt())
        except p.ProtocolError:
            raise
        except Exception as e:
            what = "messages" if chat else "prompt"
            raise p.ProtocolError(f"cannot tokenize the {what}: {e}", param=what) from None
        req.to_sampling_params(len(ids), tok.max_model_len)  # context / max_tokens / sampling checks
        return req, ids

    # ---------------------------------------------------------------- proxy
    async def handle(self, http: Request, path: str, chat: bool) -> Response:
        raw = await http.body()
        if len(raw) > self.service.config.max_body_bytes:
            raise p.ProtocolError(f"request body has {len(raw)} bytes; the limit is "
                                  f"{self.service.config.max_body_bytes}", 413)
        t0 = time.perf_counter_ns()
        req, ids = self.parse(raw, chat)
        tokenize_ns = time.perf_counter_ns() - t0
        svc, router = self.service, self.service.router
        headers = {"content-type": "application/json", **svc.headers()}
        tried: list[str] = []
        for attempt in range(svc.config.max_attempts):
            try:
                decision = router.route(ids, req.cache_salt, exclude=tried)
            except NoReplicaError as e:
                raise p.ProtocolError(str(e), 503) from None
            if attempt == 0:
                svc.metrics.observe_stages({"tokenize": tokenize_ns, **decision.timings_ns})
            rid = decision.replica_id
            spec = svc.specs.get(rid)
            if spec is None:  # removed meanwhile
                tried.append(rid)
                continue
            router.loads.on_dispatch(rid, decision.uncached_tokens)
            upstream, first, body = await self._open(spec.url + path, raw, headers)
            failed = isinstance(upstream, Exception)
            if failed or upstream.status >= 500:
                if not failed and attempt + 1 == svc.config.max_attempts:  # pass the last error through
                    router.loads.on_first_output(rid, decision.uncached_tokens)
                    return await self._finish(upstream, first, body, decision, req.stream)
                router.loads.on_finish(rid, decision.uncached_tokens, had_output=False)
                if failed:
                    svc.mark_failed(rid, isinstance(upstream, aiohttp.ClientConnectorError))
                else:
                    upstream.close()
                svc.metrics.child(svc.metrics.retries, str(rid)).inc()
                tried.append(rid)
                continue
            router.loads.on_first_output(rid, decision.uncached_tokens)
            self._count_decision(decision, len(ids))
            return await self._finish(upstream, first, body, decision, req.stream)
        raise p.ProtocolError(f"no replica answered after {len(tried)} attempts ({', '.join(map(str, tried))}); "
                              "retry later", 503)

    async def _open(self, url: str, raw: bytes, headers: dict):
        """Send the request and wait for the first body bytes: (response or error, first bytes, rest)."""
        try:
            upstream = await self.service.session.post(url, data=raw, headers=headers)
        except _UPSTREAM_ERRORS as e:
            return e, b"", None
        body = upstream.content.iter_any()
        try:
            first = await body.__anext__()
        except StopAsyncIteration:
            first = b""
        except _UPSTREAM_ERRORS as e:
            upstream.close()
            return e, b"", None
        return upstream, first, body

    def _count_decision(self, decision: RouteDecision, prompt_tokens: int) -> None:
        m, rid = self.service.metrics, str(decision.replica_id)
        m.child(m.decisions, rid, self.service.router.policy_name).inc()
        m.child(m.predicted_hit_tokens, rid).inc(decision.predicted_hit_tokens)
        m.child(m.prompt_tokens, rid).inc(prompt_tokens)

    def _report_cached(self, rid: str, chunk: bytes) -> None:
        if b"cached_tokens" in chunk:
            found = _CACHED.findall(chunk)
            if found:
                m = self.service.metrics
                m.child(m.reported_cached_tokens, rid).inc(int(found[-1]))

    async def _finish(self, upstream: aiohttp.ClientResponse, first: bytes, body, decision: RouteDecision,
                      stream: bool) -> Response:
        rid, loads = decision.replica_id, self.service.router.loads
        media = upstream.headers.get("content-type", "application/json")
        status = upstream.status
        m = self.service.metrics
        m.child(m.requests, f"{status // 100}xx").inc()
        if not stream or status != 200:
            try:
                rest = [chunk async for chunk in body]
            except _UPSTREAM_ERRORS as e:
                raise p.ProtocolError(f"replica {rid} failed while answering: {e!r}; retry the request",
                                      502) from None
            finally:
                upstream.release()
                loads.on_finish(rid, decision.uncached_tokens, had_output=True)
            content = first + b"".join(rest)
            self._report_cached(str(rid), content)
            return Response(content, status_code=status, media_type=media)
        return StreamingResponse(self._relay(upstream, first, body, decision), status_code=status,
                                 media_type=media)

    async def _relay(self, upstream: aiohttp.ClientResponse, first: bytes, body, decision: RouteDecision):
        rid = decision.replica_id
        try:
            yield first
            async for chunk in body:
                self._report_cached(str(rid), chunk)
                yield chunk
        except _UPSTREAM_ERRORS as e:
            err = p.error_body(f"replica {rid} failed mid-stream: {e!r}; the output is incomplete", 502)
            yield f"data: {json.dumps(err)}\n\n".encode()
        finally:
            upstream.release()
            self.service.router.loads.on_finish(rid, decision.uncached_tokens, had_output=True)
