"""The router's HTTP front (FastAPI): the OpenAI surface of DESIGN.md in front of the replicas.

    POST /v1/completions, /v1/chat/completions   routed and proxied (forward.py; SSE passed through)
    GET  /v1/models                              the served model
    POST /tokenize                               token ids as the replicas compute them
    GET  /health                                 200 when >= 1 replica is healthy, else 503
    GET  /metrics                                Prometheus (metrics.py)
    GET  /replicas, POST /replicas, DELETE /replicas/{id}   the dynamic replica set

With ``api_key`` set, ``/v1/*``, ``/tokenize`` and ``/replicas`` need ``Authorization: Bearer <key>``.
Errors are OpenAI-shaped JSON. ``RouterServer`` runs the app with uvicorn in a background thread
(tests, embedding) or in the foreground (the CLI).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from kvmesh.replica import protocol as p
from kvmesh.replica.http_errors import install_error_handlers
from kvmesh.router.config import ReplicaSpec, RouterConfig
from kvmesh.router.forward import Forwarder
from kvmesh.router.metrics import CONTENT_TYPE
from kvmesh.router.service import RouterService

logger = logging.getLogger(__name__)


def build_app(service: RouterService) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="kvmesh router", lifespan=lifespan, docs_url=None, redoc_url=None)
    forwarder = Forwarder(service)
    key = service.config.api_key

    def check_auth(request: Request) -> None:
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise p.ProtocolError("missing or wrong API key; send 'Authorization: Bearer <key>'", 401)

    install_error_handlers(
        app, "router", on_error=lambda e: service.metrics.requests.labels(f"{e.status_code // 100}xx").inc()
    )

    @app.post("/v1/completions")
    async def completions(request: Request):
        check_auth(request)
        return await forwarder.handle(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_auth(request)
        return await forwarder.handle(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        cfg = service.config
        name = cfg.served_model_name or cfg.model or cfg.tokenizer or "kvmesh"
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "kvmesh", "root": cfg.model}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        check_auth(request)
        tok = service.tokenizer
        if tok is None:
            raise p.ProtocolError("this router has no tokenizer; start it with --model or --tokenizer", 400)
        req = p.parse_request(p.TokenizeRequest, await _json(request))
        if req.messages is not None:
            ids = tok.render_chat([m.to_template_dict() for m in req.messages], req.add_generation_prompt)
        elif req.prompt is not None:
            ids = tok.encode(req.prompt, True if req.add_special_tokens is None else req.add_special_tokens)
        else:
            raise p.ProtocolError("send either 'prompt' or 'messages'", param="prompt")
        return {"count": len(ids), "max_model_len": tok.max_model_len, "tokens": ids}

    @app.get("/health")
    async def health():
        healthy = sorted(map(str, service.router.healthy))
        body = {"status": "ok" if healthy else "unavailable", "healthy_replicas": healthy,
                "replicas": len(service.specs)}
        if not healthy:
            body["error"] = p.error_body("no healthy replica", 503)["error"]
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/replicas")
    async def list_replicas(request: Request):
        check_auth(request)
        return {"replicas": [{"id": s.replica_id, "url": s.url, "events": s.events, "replay": s.replay,
                              "healthy": s.replica_id in service.router.healthy,
                              "degraded": service.router.degraded.get(s.replica_id)}
                             for s in service.specs.values()]}

    @app.post("/replicas")
    async def add_replica(request: Request):
        check_auth(request)
        body = await _json(request)
        try:
            spec = ReplicaSpec(url=body["url"], events=body.get("events"), replay=body.get("replay"),
                               replica_id=body.get("id") or "")
        except (KeyError, TypeError, ValueError) as e:
            raise p.ProtocolError(f"bad replica registration {body!r}: {e}; send "
                                  '{"url": "http://HOST:PORT", "events": "tcp://...", "replay": "tcp://...", '
                                  '"id": "name"}') from None
        service.add_replica(spec)
        return {"id": spec.replica_id, "healthy": await service.probe(spec)}

    @app.delete("/replicas/{replica_id:path}")
    async def delete_replica(replica_id: str, request: Request):
        check_auth(request)
        if not service.remove_replica(replica_id):
            raise p.ProtocolError(f"no replica {replica_id!r}; GET /replicas lists them", 404)
        return {"id": replica_id, "removed": True}

    return app


async def _json(request: Request):
    import json

    try:
        return json.loads(await request.body())
    except ValueError as e:
        raise p.ProtocolError(f"request body is not valid JSON: {e}") from None


class RouterServer:
    """Runs the router app with uvicorn: ``start()`` in a thread (returns once listening) or ``run()``."""

    def __init__(self, config: RouterConfig, replicas: list[ReplicaSpec] | None = None, tokenizer=None) -> None:
        self.config = config
        self.service = RouterService(config, replicas, tokenizer)
        self.app = build_app(self.service)
        self._server = uvicorn.Server(uvicorn.Config(
            self.app, host=config.host, port=config.port, log_level="warning", lifespan="on",
            access_log=False, timeout_graceful_shutdown=2))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def run(self) -> None:
        self._server.run()

    def start(self, timeout: float = 30.0) -> RouterServer:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True,
                                        name="kvmesh-router")
        self._thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout / 0.01)):
            if self._server.started or not self._thread.is_alive():
                break
            deadline.wait(0.01)
        if not self._server.started:
            raise RuntimeError(f"router did not start listening on {self.config.host}:{self.config.port}")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
