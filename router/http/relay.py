"""Relaying a stream to its client, and moving it to another replica when its own fails mid-way.

The events of the first replica go out as they come (whole SSE events, the router-only token ids cut
out); when that upstream breaks before ``[DONE]`` (or sends no bytes for ``stream_idle_timeout_s``, or an
event that is not SSE JSON), ``_migrate`` opens a continuation on another replica
(router/http/migration.py builds it and splices its events into the same stream), up to
``migration_limit`` times. A stream that cannot go on ends with an OpenAI-shaped error event and
``[DONE]`` and counts as a 5xx; a client that leaves closes the upstream, so the replica aborts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from kvmesh.replica.serving.errors import ProtocolError, error_body, log_failure
from kvmesh.router.http.failures import InvalidAnswer, count_failure
from kvmesh.router.http.migration import MigratingStream
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.sse_events import DONE, SseSplitter
from kvmesh.router.http.upstream import UpstreamError, UpstreamResponse
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.kv_router import RouteDecision

if TYPE_CHECKING:
    from kvmesh.router.http.data_plane import DataPlane

logger = logging.getLogger(__name__)
UPSTREAM_ERRORS = (UpstreamError, OSError, asyncio.TimeoutError)
"""Failures of the upstream connection (refused, reset, timed out, truncated)."""


class Opened(NamedTuple):
    """A request opened on a replica: its response, the first body bytes, the rest, the route taken, the replica."""

    upstream: UpstreamResponse
    first: bytes
    rest: AsyncIterator[bytes]
    decision: RouteDecision
    replica: Replica


Dispatch = Callable[[ProxyRequest, list[str]], Awaitable[Opened]]
"""Opens a request on the best replica not tried (``Forwarder.dispatch``, router/http/proxy.py)."""


class StreamRelay:
    """The streaming half of the proxy (router/http/proxy.py): relays one client's SSE stream and
    continues it on another replica when its replica fails mid-way."""

    def __init__(self, plane: DataPlane, dispatch: Dispatch,
                 report_cached: Callable[[RouteDecision, bytes], None]) -> None:
        self.plane = plane
        self.dispatch = dispatch
        """Opens a continuation on another replica."""
        self.report_cached = report_cached
        """Reads the cached tokens a replica reports (the first replica's usage)."""

    async def relay(self, opened: Opened, stream: MigratingStream) -> AsyncIterator[bytes]:
        """The client's stream: the first replica's events, then, if it fails mid-way, continuations."""
        upstream, first, body, decision, replica = opened
        outcome = "4xx"  # until the stream completes or breaks, an early end is the client leaving
        try:
            while True:
                rid = replica.id
                error: BaseException | None = None
                try:
                    async for out in self._events(upstream, first, body, stream, decision, replica):
                        yield out
                except UPSTREAM_ERRORS as e:
                    stream.broken, error = f"failed mid-stream: {e}", e
                finally:
                    let_go(upstream, stream.done)
                    self.plane.router.loads.on_finish(replica, decision.uncached_tokens, had_output=True,
                                                      sequences=decision.sequences)
                if not stream.done and stream.finish_reason is not None:  # only [DONE] was missing
                    for out in stream.finish(stream.finish_reason, text_sent=True):
                        yield out
                if stream.done:
                    outcome = "2xx"
                    return
                why = f"replica {rid} {stream.broken or 'ended the stream without [DONE]'}"
                if error is None and stream.invalid:
                    error = InvalidAnswer(stream.broken or "sent an event that is not SSE JSON", "invalid_sse")
                continued = await self._migrate(stream, replica, why, error)
                if continued is None:
                    outcome = "5xx"
                    yield _error_event(f"{why}; the output is incomplete")
                    return
                if not continued:  # nothing was left to generate
                    for out in stream.finish("length"):
                        yield out
                    outcome = "2xx"
                    return
                upstream, first, body, decision, replica = continued
                for out in stream.begin_continuation():
                    yield out
        except Exception as e:  # noqa: BLE001 - a bug here ends this stream cleanly, nothing else
            outcome = "5xx"
            request_id = log_failure(e, logger, "relaying a stream failed")
            yield _error_event(f"the router failed while relaying the stream (request id {request_id}); the output "
                               "is incomplete")
        finally:
            m = self.plane.metrics
            m.requests.labels(outcome).inc()

    async def _events(self, upstream: UpstreamResponse, first: bytes, body: AsyncIterator[bytes],
                      stream: MigratingStream, decision: RouteDecision, replica: Replica) -> AsyncIterator[bytes]:
        """The client's events for one upstream, until it ends, breaks, or the stream is done."""
        split, chunk = SseSplitter(), first
        outliers = self.plane.failures.outliers
        while True:
            outliers.on_progress(replica)
            if stream.migrations == 0:
                self.report_cached(decision, chunk)
            for event in split.feed(chunk):
                if stream.migrations == 0:
                    out = stream.relay(event)
                    outs = [out] if out is not None else []
                else:
                    outs = stream.splice(event)
                for out in outs:
                    yield out
                if stream.done or stream.broken:
                    return
            try:
                chunk = await body.__anext__()
            except StopAsyncIteration:
                return

    async def _migrate(self, stream: MigratingStream, replica: Replica, why: str,
                       error: BaseException | None) -> Opened | tuple[()] | None:
        """Continue ``stream`` on another replica: the opened continuation, () when no token is left to
        generate, None when it cannot migrate (limit reached, no token ids, no replica answered). The
        replica's failure (``error``, else ``why``) is counted against it (router/http/failures.py)."""
        svc, rid = self.plane, replica.id
        if error is not None:
            count_failure(svc.failures, replica, error)
        else:
            svc.failures.mark_failed(replica, False, why, "mid_stream")
        if not stream.can_migrate():
            return None
        body = stream.continuation()
        if body is None:
            return ()
        logger.warning("%s; continuing the stream on another replica (migration %d)", why, stream.migrations + 1)
        try:
            opened = await self.dispatch(ProxyRequest.continuation(
                body, stream.prompt_ids + stream.output_ids, stream.req.cache_salt, stream.model_pool, stream.priority),
                [rid])
        except ProtocolError:
            return None
        if opened.upstream.status != 200:
            opened.upstream.close()
            svc.router.loads.on_finish(opened.replica, opened.decision.uncached_tokens, had_output=True,
                                       sequences=opened.decision.sequences)
            return None
        svc.metrics.child(svc.metrics.migrations, str(rid)).inc()
        return opened


def let_go(upstream: UpstreamResponse, complete: bool) -> None:
    """A fully read response goes back to the pool; an abandoned one is closed, so the replica sees the
    disconnect and aborts the request."""
    if complete:
        upstream.release()
    else:
        upstream.close()


def _error_event(message: str) -> bytes:
    """An OpenAI-shaped error event, then ``[DONE]`` (what a replica sends when a stream fails)."""
    return f"data: {json.dumps(error_body(message, 502))}\n\n".encode() + DONE + b"\n\n"
