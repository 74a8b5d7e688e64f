"""The replica's HTTP server (FastAPI): OpenAI endpoints, health, metrics, load and info for routers.

    POST /v1/completions, /v1/chat/completions   (server_openai.py; SSE with stream=true)
    GET  /v1/models                              the served model
    POST /tokenize                               token ids exactly as a request would get them
    GET  /health                                 200 while the engine runs, 503 otherwise
    GET  /metrics                                Prometheus (vLLM names, metrics.py)
    GET  /load                                   JSON LoadReport for routers (cheap, polled often)
    GET  /server_info, /get_server_info          engine settings (SGLang-style routers ask these)
    GET  /model_info, /get_model_info            model path / tokenizer path

With ``api_key`` set, every ``/v1/*`` route needs ``Authorization: Bearer <key>`` (vLLM's rule);
the others stay open so health checks and scrapers work. Errors are OpenAI-shaped JSON.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from kvmesh.replica import protocol as p
from kvmesh.replica.http_errors import error_response, install_error_handlers
from kvmesh.replica.metrics import CONTENT_TYPE, ReplicaMetrics
from kvmesh.replica.server_openai import OpenAIHandlers

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ServerConfig:
    """How the replica's HTTP server listens and what it calls itself."""

    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 locally, the node's IP inside a cluster (never 0.0.0.0 by default)."""
    port: int = 8100
    """TCP port; 0 picks a free one (read it back from ``HTTPServer.port``)."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token required on /v1/* routes; None disables auth."""
    served_model_name: str | None = None
    """Name clients put in "model"; None uses the model path."""
    default_max_tokens: int | None = None
    """max_tokens for chat requests that set none; None fills the context (vLLM's behaviour)."""
    max_body_bytes: int = 32 << 20
    """Largest request body accepted (413 above)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is not a TCP port; use 0..65535 (0 = ephemeral)")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key is empty; give a secret or leave it unset")


class ServerState:
    """What every handler needs: the engine client, the tokenizer, names and metrics."""

    def __init__(self, engine: Any, tokenizer: Any, config: ServerConfig, model_path: str,
                 extra_info: dict[str, Any] | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.model_path = model_path
        self.model_name = config.served_model_name or model_path
        self.default_max_tokens = config.default_max_tokens
        self.extra_info = dict(extra_info or {})
        self.metrics = ReplicaMetrics(engine.get_stats, self.model_name)

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.model_name, self.model_path):
            raise p.ProtocolError(
                f"The model {model!r} does not exist; this server serves {self.model_name!r} (see /v1/models).",
                404, param="model")

    async def read_json(self, http: Request) -> Any:
        body = await http.body()
        if len(body) > self.config.max_body_bytes:
            raise p.ProtocolError(f"request body has {len(body)} bytes; the limit is {self.config.max_body_bytes}",
                                  413)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise p.ProtocolError(f"request body is not valid JSON: {e}") from None

    def server_info(self) -> dict[str, Any]:
        e = self.engine
        return {"model": self.model_name, "model_path": self.model_path, "max_model_len": e.max_model_len,
                "block_size": e.block_size, "num_kv_blocks": e.num_kv_blocks,
                "tensor_parallel_size": e.tensor_parallel_size, "version": "kvmesh", **self.extra_info}


KNOWN_PATHS = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/health", "/metrics", "/load",
    "/server_info", "/get_server_info", "/model_info", "/get_model_info",
})


class AuthAndCountMiddleware:
    """Pure ASGI (no response buffering, unlike ``BaseHTTPMiddleware``): the API key check on
    /v1/* and a per-endpoint status counter."""

    def __init__(self, app: Any, state: ServerState):
        self.app = app
        self.state = state
        key = state.config.api_key
        self.expected = f"Bearer {key}".encode() if key is not None else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        label = path if path in KNOWN_PATHS else "other"  # bounded label set, whatever clients send
        if self.expected is not None and path.startswith("/v1"):
            header = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(header, self.expected):
                self.state.metrics.count_request(label, 401)
                err = p.ProtocolError("missing or wrong API key; send 'Authorization: Bearer <key>'", 401)
                return await error_response(err)(scope, receive, send)
        status = [500]

        async def send_counting(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        finally:
            self.state.metrics.count_request(label, status[0])


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app of one replica."""
    app = FastAPI(title="kvmesh replica", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.kvmesh = state
    handlers = OpenAIHandlers(state)
    app.add_middleware(AuthAndCountMiddleware, state=state)

    install_error_handlers(app, "replica")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handlers.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handlers.chat(request)

    @app.get("/v1/models")
    async def models():
        card = p.ModelCard(id=state.model_name, root=state.model_path, max_model_len=state.engine.max_model_len)
        return p.ModelList(data=[card]).model_dump()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = p.parse_request(p.TokenizeRequest, await state.read_json(request))
        state.check_model(req.model)
        tok = state.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise p.ProtocolError("send exactly one of 'prompt' or 'messages'")
        if req.prompt is not None:
            ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)
        elif req.add_special_tokens:
            ids = tok.encode(tok.apply_chat_template([m.to_template_dict() for m in req.messages],
                                                     req.add_generation_prompt), add_special_tokens=True)
        else:
            ids = tok.render_chat([m.to_template_dict() for m in req.messages], req.add_generation_prompt)
        return p.TokenizeResponse(count=len(ids), max_model_len=state.engine.max_model_len, tokens=ids).model_dump()

    @app.get("/health")
    async def health():
        reason = state.engine.dead_reason()
        if reason is not None:
            return error_response(p.ProtocolError(f"replica is not healthy: {reason}", 503))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/load")
    async def load():
        return state.engine.load_report().model_dump()

    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, state.server_info, methods=["GET"])

    def model_info():
        return {"model_path": state.model_path, "tokenizer_path": getattr(state.tokenizer, "name", state.model_path),
                "served_model_name": state.model_name, "is_generation": True}

    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"])
    return app
