"""The proxy: one OpenAI request read, tokenized, routed and sent to a replica, its answer passed back.

    handle: read (body -> ProxyRequest) -> dispatch (route -> open on a replica, retry) -> answer

A replica that fails before sending its first byte (refused connection, reset, 5xx, no first bytes
within ``first_byte_timeout_s`` while it showed no progress: router/replicas/patience.py) is excluded and the
request goes to the next choice, up to ``max_attempts`` replicas; so does a non-streamed 200 whose body
is not JSON (nothing reached the client yet). Each failure counts towards ejecting the replica
(router/http/failures.py, router/routing/outlier.py), a 5xx once the request's attempts are over unless every
replica it went to answered it so; a 4xx is the request's own and goes back as it is. Once bytes flow they go to the
client (relay.py),
and a stream that breaks or stalls then goes on from another replica (migration.py). A client that disconnects before
its
answer cancels the upstream request (the replica sees the connection close and aborts it). Each
replica gets the body in the form it takes (``ProxyRequest.encoded_for``: tokenize once); a stream's
asks for ``"return_token_ids": true``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.router.http.adapter_ready import adapter_ready
from kvmesh.router.http.caller import schedules_by_priority
from kvmesh.router.http.compile_charge import compile_tokens
from kvmesh.router.http.failures import BrokenAnswer, InvalidAnswer, count_failure, settle_5xx
from kvmesh.router.http.in_flight import InFlight, reserved
from kvmesh.router.http.kv_handoff import KVHandoff
from kvmesh.router.http.messages import HttpRequest, Response
from kvmesh.router.http.proxy_request import ProxyRequest
from kvmesh.router.http.relay import UPSTREAM_ERRORS, Opened, StreamRelay, let_go
from kvmesh.router.http.request_reader import RequestReader
from kvmesh.router.http.route_accounting import count_decision, report_cached
from kvmesh.router.http.token_forwarding import TEXT
from kvmesh.router.http.upstream import header_lines
from kvmesh.router.routing.kv_router import RouteDecision
from kvmesh.router.routing.policies import NoReplicaError

if TYPE_CHECKING:
    from kvmesh.router.http.data_plane import DataPlane
    from kvmesh.router.replicas.replica import Replica

logger = logging.getLogger(__name__)


class Forwarder:
    """The /v1/completions and /v1/chat/completions handlers of the router."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        """What the proxy works with (data_plane.py)."""
        self.header_lines = header_lines({"content-type": "application/json", **plane.headers})
        """The headers every request to a replica carries (its credentials), as lines (upstream.py)."""
        self.reader = RequestReader(plane)
        """Reads a client's request: validated, tokenized, its tenant and priority (request_reader.py)."""
        self.relay = StreamRelay(plane, self.dispatch, self.report_cached)
        """Relays streams and migrates them when their replica fails mid-way (relay.py)."""
        self.handoff = KVHandoff(plane)
        """The P/D split's prefill call and peer pulls: what the decode replica gets in kv_transfer_params."""

    # ---------------------------------------------------------------- proxy
    async def handle(self, http: HttpRequest, path: str, chat: bool) -> Response:
        """Answer one request (an ``HttpRequest``): read, wait for its router's turn to decide when the service's
        routers take turns (router/control/turns.py), admit (admission_gate.py), forward. A client that leaves
        cancels this coroutine (the door does): out of the router's queue, or its upstream connection closed."""
        request, gate = await self.reader.read(http, path, chat), self.plane.admission
        if self.plane.turn is not None:
            await self.plane.turn()
        if gate is None:
            return await self.forward(request)
        admitted = await gate.admit(http, request)
        if isinstance(admitted, Response):  # 429
            return admitted
        try:
            return gate.answered(admitted, await self.forward(request, admitted.decision), request)
        except BaseException:  # a failure or a cancellation: nothing charged, its room given on
            gate.finished(admitted, 0)
            raise

    async def forward(self, request: ProxyRequest, first: RouteDecision | None = None) -> Response:
        """Dispatch and answer ``request`` (``first``: admission's route), on another replica after a broken answer."""
        tried: list[str] = []
        while True:
            opened = await self.dispatch(request, tried, None if tried else first)
            try:
                response = await self._answer(request, opened)
                break
            except (InvalidAnswer, BrokenAnswer) as e:  # nothing reached the client: another replica, if one is left
                rid = opened.replica.id
                self.handoff.abandon(request)
                tried.append(rid)
                failure = e.error if isinstance(e, BrokenAnswer) else e
                request.failed_over.append(f"{rid}: {count_failure(self.plane.failures, opened.replica, failure)}")
                if len(tried) >= self.plane.config.upstream.max_attempts:  # the detail is logged, never answered
                    logger.warning("replica %s: %s; giving up after %d attempts", rid, e, len(tried))
                    raise ProtocolError(f"replica {rid} sent a broken or invalid answer; no replica answered after "
                                        f"{len(tried)} attempts", 502) from None
        if request.wants_receipt:
            response.headers.update(opened.decision.receipt.headers())
        return response

    async def dispatch(self, request: ProxyRequest, tried: list[str], first: RouteDecision | None = None) -> Opened:
        """Open ``request`` on the best replica not ``tried`` (first on ``first``, admission's route), moving on when
        one fails before its first byte; the last attempt's 5xx if all failed so. Each replica gets its body's form;
        its load counts the attempt while it runs (in_flight.py)."""
        svc, attempts = self.plane, self.plane.config.upstream.max_attempts
        failures, pool = svc.failures, request.model_pool
        headers = self.header_lines + header_lines(request.headers())
        held: list[tuple[Replica, int]] = []  # 5xx answers, counted once the attempts are over (failures.py)
        try:
            for attempt in range(attempts):
                decision, routed_at = self._route(request, tried, first if attempt == 0 else None, attempt)
                replica = decision.replica
                if _gone(replica, tried) or (pool is not None and pool.lora_name is not None
                                             and not await adapter_ready(svc, replica, request, tried)):
                    continue
                if attempt == 0 and not tried and request.req is not None:  # a retry or continuation goes as sent
                    if self.handoff.may_split(request):
                        with reserved(svc.router.loads, replica):  # its slot is taken while the prefill call runs
                            await self.handoff.prepare(request, decision)
                    else:
                        self.handoff.pull(request, decision)
                with InFlight(svc.router, decision, len(request.route_ids)) as flight:
                    opened = await self._open(replica, request, headers + header_lines(flight.headers()), decision)
                    if isinstance(opened, Exception):  # a failed connection or deadline: the 5xx before it count
                        settle_5xx(failures, held, answered_elsewhere=True)
                    elif opened.upstream.status >= 500:
                        held.append((replica, opened.upstream.status))
                        if attempt + 1 == attempts:  # pass the last error through
                            flight.answered()
                            return opened
                    else:
                        settle_5xx(failures, held, answered_elsewhere=True)
                        self._opened(request, opened, flight, routed_at, tried)
                        return opened
                self._fail_over(request, opened, replica, tried)
        finally:
            settle_5xx(failures, held, answered_elsewhere=False)
        raise ProtocolError(f"no replica answered after {len(tried)} attempts ({', '.join(map(str, tried))}); "
                            "retry later", 503)

    def _route(self, request: ProxyRequest, tried: list[str], first: RouteDecision | None,
               attempt: int) -> tuple[RouteDecision, float]:
        """The attempt's route (``first`` when given) and the clock its TTFT counts from; 503 for no replica left."""
        svc = self.plane
        routed_at = time.perf_counter()
        try:
            decision = first if first is not None else request.route(svc.router, tried)
        except NoReplicaError as e:
            raise ProtocolError(str(e), 503) from None
        if decision is first:  # admission's route, made when it let the request go: its TTFT counts from then
            routed_at = min(routed_at, decision.decided_at_ns * 1e-9)
        if attempt == 0 and request.tokenize_ns is not None:
            svc.metrics.observe_stages(request.tokenize_ns, decision.timings_ns)
        return decision, routed_at

    def _opened(self, request: ProxyRequest, opened: Opened, flight: InFlight, routed_at: float,
                tried: list[str]) -> None:
        """The replica sent its first bytes: a success for its health, a split's lease settled, its prefill done,
        a stream's TTFT learnt against the prediction, the route counted."""
        svc, decision = self.plane, opened.decision
        svc.failures.outliers.on_success(opened.replica)
        self.handoff.opened(decision, opened.upstream)
        flight.answered()
        if request.stream is not None:  # a stream's first bytes: its TTFT, against the prediction
            tokenized_s = (request.tokenize_ns or 0) * 1e-9 if not tried else 0.0
            svc.router.observe_ttft(decision, time.perf_counter() - routed_at + tokenized_s, self._target_s(request))
            svc.receipt_metrics.on_ttft(decision.receipt)
        if request.failed_over:
            decision.receipt.failed_over = tuple(request.failed_over)
        count_decision(svc, decision, len(request.route_ids))

    def _target_s(self, request: ProxyRequest) -> float | None:
        """The request's TTFT target as the router learns its queue's tail against it: its priority class's deadline
        (``admission.ttft_deadline_s``, which the operator sets), not a deadline the client wrote; None: the
        router's ``admission.ttft_target_s``."""
        gate = self.plane.admission
        if gate is None or request.priority is None:
            return None
        return gate.config.class_deadline_s(request.priority)

    def _fail_over(self, request: ProxyRequest, opened: Opened | Exception, replica: Replica,
                   tried: list[str]) -> None:
        """``replica`` failed before its first byte (an error, or a 5xx not passed through): its split's lease
        released, the failure counted against it, the request moves on to the next replica."""
        svc, rid = self.plane, replica.id
        self.handoff.abandon(request)
        if isinstance(opened, Exception):
            why = count_failure(svc.failures, replica, opened)
        else:
            why = f"HTTP {opened.upstream.status}"
            opened.upstream.close()
        svc.metrics.child(svc.metrics.retries, str(rid)).inc()
        request.failed_over.append(f"{rid}: {why}")
        tried.append(rid)

    async def _open(self, replica: Replica, request: ProxyRequest, headers: str,
                    decision: RouteDecision) -> Opened | Exception:
        """Send the request to ``replica`` in the form it takes, with ``headers`` (their lines), and wait for the
        first body bytes (or the error that came instead)."""
        svc = self.plane
        try:
            body = await request.encoded_for(replica.accepts or TEXT, schedules_by_priority(replica), svc.renderer.run)
            upstream = await svc.pool.post(replica.spec.url, request.path, body, headers,
                                           svc.failures.patience(replica))
        except UPSTREAM_ERRORS as e:
            return e
        first = upstream.ready()  # usually the first body bytes came with the head
        if first is None:
            try:
                first = await upstream.__anext__()
            except StopAsyncIteration:
                first = b""
            except UPSTREAM_ERRORS as e:
                upstream.close()
                return e
            except BaseException:  # cancelled: close the connection so the replica aborts the request
                upstream.close()
                raise
        return Opened(upstream, first, upstream, decision, replica)

    def report_cached(self, decision: RouteDecision, chunk: bytes) -> None:
        """Count the cached tokens a replica reported in ``chunk`` against the route (route_accounting.py)."""
        report_cached(self.plane, decision, chunk)

    async def _answer(self, request: ProxyRequest, opened: Opened) -> Response:
        """The client's answer: a stream relayed (and migrated if need be), or the whole body."""
        upstream, decision, replica = opened.upstream, opened.decision, opened.replica
        router = self.plane.router
        request.compile_tokens += compile_tokens(upstream.headers, replica, router.replicas)
        media = upstream.headers.get("content-type", "application/json")
        status = upstream.status
        if request.stream is not None and status == 200:
            return Response(stream=self.relay.relay(opened, request.stream), status=status, media_type=media)
        complete = False
        try:
            if upstream.complete and not upstream.chunks and opened.rest is upstream:  # it all came with the head
                rest = []
            else:
                rest = [chunk async for chunk in opened.rest]
            complete = True
        except UPSTREAM_ERRORS as e:  # nothing reached the client yet: handle() tries another replica
            raise BrokenAnswer(e) from None
        finally:
            let_go(upstream, complete)
            router.loads.on_finish(replica, decision.uncached_tokens, had_output=True, sequences=decision.sequences)
        content = opened.first + b"".join(rest)
        if status == 200:
            try:
                msgspec.json.decode(content, type=msgspec.Raw)  # checks the syntax, builds nothing
            except msgspec.DecodeError as e:
                raise InvalidAnswer(f"answered 200 with a body that is not JSON ({e}): {content[:80]!r}") from None
        m = self.plane.metrics
        m.requests.labels(f"{status // 100}xx").inc()
        self.report_cached(decision, content)
        return Response(content, status, media)


def _gone(replica: Replica, tried: list[str]) -> bool:
    """Whether the chosen ``replica`` was removed meanwhile (then its id is tried)."""
    if replica.removed or replica.spec is None:
        tried.append(replica.id)
        return True
    return False
