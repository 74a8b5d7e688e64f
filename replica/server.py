"""The replica's HTTP server (FastAPI): OpenAI endpoints, health, metrics, load and info for routers.

    POST /v1/completions, /v1/chat/completions   (server_openai.py; SSE with stream=true)
    POST /tokenize, /v1/completions/render, /v1/chat/completions/render, GET /version
                                                 shared with the router (replica/openai/routes.py)
    GET  /v1/models                              the served model
    GET  /health, /ping                          200 while the engine runs, 503 otherwise
    GET  /metrics                                Prometheus (vLLM names, metrics.py)
    GET  /load                                   JSON LoadReport for routers (cheap, polled often)
    GET  /get_load                               the same as SGLang's shape (sglang-router probes it)
    GET  /server_info, /get_server_info          engine settings (SGLang-style routers ask these)
    GET  /model_info, /get_model_info            model path / tokenizer path

With ``api_key`` set, every path except health, ping, version, load and metrics needs
``Authorization: Bearer <key>`` (replica/openai/auth.py). Errors are OpenAI-shaped JSON.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from kvmesh.replica.interfaces import EngineClient
from kvmesh.replica.metrics import ReplicaMetrics
from kvmesh.replica.openai import responses as r
from kvmesh.replica.openai.auth import AuthMiddleware
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.openai.errors import error_response, install_error_handlers
from kvmesh.replica.openai.protocol import check_model
from kvmesh.replica.openai.renderer import PromptRenderer
from kvmesh.replica.openai.routes import install_shared_routes
from kvmesh.replica.server_openai import OpenAIHandlers
from kvmesh.replica.serving.errors import ProtocolError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerConfig:
    """How the replica's HTTP server listens and what it calls itself."""

    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 locally, the node's IP inside a cluster (never 0.0.0.0 by default)."""
    port: int = 8100
    """TCP port; 0 picks a free one (read it back from ``HTTPServer.port``)."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token required on every path but health/ping/version/load/metrics; None disables auth."""
    served_model_name: str | None = None
    """Name clients put in "model"; None uses the model path."""
    default_max_tokens: int | None = None
    """max_tokens for chat requests that set none; None fills the context (vLLM's behaviour)."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """Body/prompt limits, chat template trust and read timeouts (shared with the router)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is not a TCP port; use 0..65535 (0 = ephemeral)")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key is empty; give a secret or leave it unset")


class ServerState:
    """What every handler needs: the engine client, the prompt renderer, names and metrics."""

    def __init__(self, engine_client: EngineClient, tokenizer: Any, config: ServerConfig, model_path: str,
                 extra_info: dict[str, Any] | None = None):
        self.engine_client = engine_client
        self.tokenizer = tokenizer
        self.renderer = PromptRenderer(tokenizer, config.frontend)
        self.config = config
        self.model_path = model_path
        self.model_name = config.served_model_name or model_path
        self.default_max_tokens = config.default_max_tokens
        self.extra_info = dict(extra_info or {})
        self.metrics = ReplicaMetrics(engine_client.get_stats, self.model_name,
                                      cache_info=_cache_config_info(engine_client))

    def check_model(self, model: str | None) -> None:
        check_model(model, self.model_name, aliases=(self.model_path,))

    async def read_request(self, http: Request, model_cls: type) -> Any:
        """The body validated into ``model_cls`` (limits applied while reading), for the served model."""
        req = await read_request(http, model_cls, self.config.frontend, self.renderer.run)
        self.check_model(req.model)
        return req

    def server_info(self) -> dict[str, Any]:
        e = self.engine_client
        return {"model": self.model_name, "model_path": self.model_path, "max_model_len": e.max_model_len,
                "block_size": e.block_size, "num_kv_blocks": e.num_kv_blocks,
                "tensor_parallel_size": e.tensor_parallel_size, "version": "kvmesh",
                "tokenizer_fingerprint": self.tokenizer.fingerprint if self.tokenizer is not None else None,
                **self.extra_info}


def _cache_config_info(engine: Any) -> dict[str, Any]:
    """The labels of ``vllm:cache_config_info`` (vLLM's CacheConfig names; "gpu" blocks = KV blocks on any device)."""
    config = engine.config
    return {"block_size": engine.block_size, "num_gpu_blocks": engine.num_kv_blocks,
            "enable_prefix_caching": config.enable_prefix_caching, "gpu_memory_utilization": config.gpu_memory_utilization,
            "eviction_policy": config.eviction_policy}


KNOWN_PATHS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/health", "/ping", "/version",
    "/metrics", "/load", "/get_load", "/server_info", "/get_server_info", "/model_info", "/get_model_info",
    "/v1/completions/render", "/v1/chat/completions/render",
})


class CountMiddleware:
    """Pure ASGI (no response buffering, unlike ``BaseHTTPMiddleware``): a per-endpoint status counter."""

    def __init__(self, app: Any, metrics: ReplicaMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        label = path if path in KNOWN_PATHS else "other"  # bounded label set, whatever clients send
        status = [500]

        async def send_counting(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            self.metrics.count_request(label, status[0])


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app of one replica."""
    app = FastAPI(title="kvmesh replica", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.kvmesh = state
    handlers = OpenAIHandlers(state)
    app.add_middleware(AuthMiddleware, api_key=state.config.api_key)
    app.add_middleware(CountMiddleware, metrics=state.metrics)  # outermost: refusals are counted too

    install_error_handlers(app, "replica")
    install_shared_routes(app, state.renderer, state.check_model, lambda: state.model_name)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handlers.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handlers.chat(request)

    @app.get("/v1/models")
    async def models():
        card = r.ModelCard(id=state.model_name, root=state.model_path, max_model_len=state.engine_client.max_model_len)
        return r.ModelList(data=[card]).model_dump()

    async def health():
        reason = state.engine_client.dead_reason()
        if reason is not None:
            return error_response(ProtocolError(f"replica is not healthy: {reason}", 503))
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ping", health, methods=["GET", "POST"])  # vLLM's alias (SageMaker-style probes)

    @app.get("/metrics")
    async def metrics(request: Request):
        return state.metrics.response(request.headers.get("accept"))

    @app.get("/load")
    async def load():
        return state.engine_client.load_report().to_dict()

    @app.get("/get_load")
    async def get_load():
        report = state.engine_client.load_report()
        return [{"dp_rank": 0, "num_reqs": report.num_requests_running + report.num_requests_waiting,
                 "num_waiting_reqs": report.num_requests_waiting, "num_tokens": report.num_waiting_prefill_tokens}]

    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, state.server_info, methods=["GET"])

    def model_info():
        return {"model_path": state.model_path, "tokenizer_path": getattr(state.tokenizer, "name", state.model_path),
                "served_model_name": state.model_name, "is_generation": True}

    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"])
    return app
