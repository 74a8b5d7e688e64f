"""The router's HTTP front: the OpenAI surface of DESIGN.md in front of the replicas.

    POST /v1/completions, /v1/chat/completions   routed and proxied (forward.py; SSE passed through),
                                                 served by the lean server directly (``hot_routes``)
    everything else                              the FastAPI app (``build_app``), through the same server
    POST /tokenize, /v1/completions/render, /v1/chat/completions/render, GET /version
                                                 shared with the replica (replica/openai/routes.py)
    GET  /v1/models                              the served model
    GET  /health, /ping                          200 when >= 1 replica is healthy, else 503
    GET  /get_load                               the router's in-flight requests (SGLang's shape)
    GET  /metrics                                Prometheus (metrics.py)
    /replicas..., /admin/...                     the replica set and the admin plane (admin_routes.py)

Auth is one rule (replica/openai/auth.py), the app's middleware and ``hot_routes`` both apply it:
with ``api_key`` set every path but the probes needs it; changing the replica set needs
``admin_key``, which tenants never hold, and is refused for everyone when none is configured.
``RouterServer`` runs both on one port (router/http/door.py) in a background thread (tests,
embedding) or in the foreground (the CLI, a worker on an inherited socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from typing import Any

from fastapi import FastAPI
from fastapi import Request as AppRequest
from fastapi.responses import JSONResponse
from kvmesh.replica.openai.auth import AuthMiddleware
from kvmesh.replica.openai.errors import install_error_handlers
from kvmesh.replica.openai.routes import install_shared_routes
from kvmesh.replica.serving.errors import ProtocolError, error_body
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.control.admin_routes import install_replica_routes, is_admin_request
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.door import HttpServer
from kvmesh.router.http.messages import Request, Response
from kvmesh.router.http.proxy import Forwarder

logger = logging.getLogger(__name__)


def served_model(cfg: RouterConfig) -> str:
    return cfg.served_model_name or cfg.model or cfg.tokenizer or "kvmesh"


def _error_counter(runtime: RouterRuntime):
    def count_error(e: ProtocolError) -> None:
        runtime.metrics.child(runtime.metrics.requests, f"{e.status_code // 100}xx").inc()

    return count_error


def hot_routes(runtime: RouterRuntime) -> dict[tuple[bytes, str], Any]:
    """The proxied paths, served by the lean server without ASGI: (method, path) -> handler.
    The same auth rule as the app's middleware (``AuthMiddleware.refusal``)."""
    cfg = runtime.config
    forwarder = Forwarder(runtime)
    auth = AuthMiddleware(None, api_key=cfg.api_key, admin_key=cfg.admin_key, is_admin=is_admin_request)
    model_name = served_model(cfg)

    def route(path: str, chat: bool):
        async def handle(request: Request) -> Response:
            if auth.api is not None or auth.admin is not None:
                header = next((v for k, v in request.raw_headers if k == b"authorization"), b"")
                refused = auth.refusal("POST", path, header)
                if refused is not None:
                    raise refused
            start = time.perf_counter()
            response = await forwarder.handle(request, path, chat=chat)
            return runtime.metrics.observe_response(response, start, model_name)

        return handle

    return {(b"POST", "/v1/completions"): route("/v1/completions", False),
            (b"POST", "/v1/chat/completions"): route("/v1/chat/completions", True)}


def build_app(runtime: RouterRuntime) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="kvmesh router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    cfg = runtime.config
    count_error = _error_counter(runtime)
    app.add_middleware(AuthMiddleware, api_key=cfg.api_key, admin_key=cfg.admin_key, is_admin=is_admin_request,
                       on_refused=count_error)
    install_error_handlers(app, "router", on_error=count_error)
    model_name = served_model(cfg)
    install_shared_routes(app, runtime.renderer, runtime.check_model, lambda: model_name)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "kvmesh",
                                            "root": cfg.model}]}

    async def health():
        healthy = sorted(map(str, runtime.router.healthy))
        feed = runtime.feed_state()
        body = {"status": "ok" if healthy else "unavailable", "healthy_replicas": healthy,
                "replicas": len(runtime.specs), "event_feed": feed,
                "degraded_replicas": {str(rid): why for rid, why in list(runtime.router.degraded.items())}}
        if healthy and not feed["alive"]:  # requests are still served, by load only
            body["status"] = "degraded"
            body["warning"] = (f"the KV event feed is down ({feed['error']}); routing by load only until it "
                               "restarts")
        if not healthy:
            body["error"] = error_body("no healthy replica", 503)["error"]
        return JSONResponse(body, status_code=200 if healthy else 503)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ping", health, methods=["GET", "POST"])

    @app.get("/get_load")
    async def get_load():
        loads = runtime.router.loads.loads.values()
        return [{"dp_rank": 0, "num_reqs": sum(load.in_flight for load in loads), "num_waiting_reqs": 0,
                 "num_tokens": sum(load.pending_prefill_tokens for load in loads)}]

    @app.get("/metrics")
    async def metrics(request: AppRequest):
        return runtime.metrics.response(request.headers.get("accept"))

    install_replica_routes(app, runtime)
    return app


class RouterServer:
    """The router on the lean server (router/http/): ``start()`` in a thread (returns once listening),
    ``run()`` in the foreground until SIGINT/SIGTERM, ``serve()`` inside a running loop."""

    def __init__(self, config: RouterConfig, replicas: list[ReplicaSpec] | None = None, tokenizer=None,
                 extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.config = config
        self.runtime = RouterRuntime(config, replicas, tokenizer)
        self.app = build_app(self.runtime)
        self.http = HttpServer(hot_routes(self.runtime), self.app, config.frontend, extra_headers)
        self.http.on_error = _error_counter(self.runtime)
        self.port = config.port
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def use_app(self, app) -> None:
        """Serve ``app`` (e.g. ``self.app`` wrapped by a worker's setup) for every path but the proxied
        ones; its ASGI lifespan runs at start and stop."""
        self.app = app
        self.http.asgi.app = app

    async def serve(self, sock=None, graceful_s: float = 2.0, drain_s: float = 0.0,
                    started: threading.Event | None = None) -> None:
        """Run the runtime (the app's lifespan) and serve until ``request_stop``; then shut down gracefully
        (``drain_s``: keep answering open connections with ``Connection: close`` first)."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._drain_s = drain_s
        async with self.http.asgi.lifespan():
            self.port = await self.http.listen(self.config.host, self.config.port, sock)
            logger.info("kvmesh-router listening on %s", self.url)
            if started is not None:
                started.set()
            await self._stop.wait()
            await self.http.shutdown(graceful_s, self._drain_s)

    def request_stop(self, drain_s: float | None = None) -> None:
        """Stop serving (thread-safe); ``drain_s`` replaces the drain period given to ``serve``."""
        if self._loop is None or self._stop is None:
            return

        def stop() -> None:
            if drain_s is not None:
                self._drain_s = drain_s
            self._stop.set()

        self._loop.call_soon_threadsafe(stop)

    def run(self, sock=None, graceful_s: float = 2.0, drain_s: float = 0.0) -> None:
        """Serve in the foreground until SIGINT (shut down) or SIGTERM (drain ``drain_s``, then shut down)."""
        async def main() -> None:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, self.request_stop, 0.0)
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
            await self.serve(sock, graceful_s, drain_s)

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())

    def start(self, timeout: float = 30.0) -> RouterServer:
        started, error = threading.Event(), []

        def run() -> None:
            try:
                with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                    runner.run(self.serve(started=started))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                error.append(e)
                started.set()

        self._thread = threading.Thread(target=run, name="kvmesh-router", daemon=True)
        self._thread.start()
        if not started.wait(timeout) or error:
            raise RuntimeError(f"router did not start listening on {self.config.host}:{self.config.port}: "
                               f"{error[0] if error else 'timeout'}")
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self.request_stop()
        self._thread.join(15)
        self._thread = None


def _loop_factory():
    """uvloop's loop when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
