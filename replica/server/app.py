"""The replica's HTTP server (FastAPI): OpenAI endpoints, health, metrics, load and info for routers.

    POST /v1/completions, /v1/chat/completions   (completions.py; SSE with stream=true)
    POST /v1/responses, GET/DELETE /v1/responses/{id}   OpenAI's Responses API on the chat path (responses_routes.py)
    POST /tokenize, /detokenize, /v1/completions/render, /v1/chat/completions/render, GET /version
                                                 shared with the router (replica/openai/routes.py)
    GET  /v1/models                              the served model, then its LoRA adapters (``parent``: the model)
    GET  /v1/models/{id}                         one of them (vLLM's card); a 404 naming what is served
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter   LoRA adapters at runtime (lora_models.py; admin plane)
    POST /reset_prefix_cache                     every cached block no request holds is freed (vLLM's; admin plane)
    GET  /health, /ping                          200 while the engine runs, 503 otherwise
    GET  /metrics                                Prometheus (vLLM names, metrics.py)
    GET  /load                                   JSON LoadReport for routers (cheap, polled often)
    GET  /get_load                               the same as SGLang's shape (sglang-router probes it)
    GET  /server_info, /get_server_info          engine settings (SGLang-style routers ask these)
    GET  /model_info, /get_model_info            model path / tokenizer path
    GET  /kv/handshake, POST /kv/lease, /kv/release   KV transfer to peer replicas (kv_routes.py; 503 when off)

With ``api_key`` set, every path except health, ping, version, load and metrics needs
``Authorization: Bearer <key>`` (replica/openai/auth.py). With ``internal_key`` set, that key passes every
path and alone opens the KV plane: /kv/* and a body's ``kv_transfer_params`` (kv_plane.py); with ``router_only``
(``kvmesh serve``'s replicas) it alone opens every path but the public ones. The admin
paths (LoRA adapters, the prefix cache reset) take the admin key (``admin_key``) or the internal key, never the API key;
with no key set at all they are
open (vLLM's). Errors are OpenAI-shaped JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from kvmesh.replica.openai.auth import AuthMiddleware, is_operator, never_admin
from kvmesh.replica.openai.errors import error_response, install_error_handlers
from kvmesh.replica.openai.lora_adapters import LORA_ADMIN_PATHS
from kvmesh.replica.openai.prefix_cache_reset import RESET_PREFIX_CACHE_PATH
from kvmesh.replica.openai.responses import ModelCard, ModelList, card_named
from kvmesh.replica.openai.routes import install_shared_routes
from kvmesh.replica.server import kv_plane
from kvmesh.replica.server.completions import OpenAIHandlers
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.server.kv_routes import install_kv_routes
from kvmesh.replica.server.lora_models import install_lora_routes
from kvmesh.replica.server.metrics import CountMiddleware
from kvmesh.replica.server.responses_routes import install_responses_routes
from kvmesh.replica.server.state import ServerState
from kvmesh.replica.serving.errors import ProtocolError

logger = logging.getLogger(__name__)


def is_replica_admin(method: str, path: str) -> bool:
    """The replica's admin plane: loading and unloading LoRA adapters, resetting the prefix cache (the admin or
    the internal key)."""
    return path in LORA_ADMIN_PATHS or path == RESET_PREFIX_CACHE_PATH


def admin_rule(server: ReplicaServerConfig) -> Callable[[str, str], bool]:
    """The admin plane's paths when any key is set; none with no key at all (open, as a plain vLLM server)."""
    keyed = any(key is not None for key in (server.api_key, server.admin_key, server.internal_key))
    return is_replica_admin if keyed else never_admin


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app of one replica."""
    app = FastAPI(title="kvmesh replica", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.kvmesh = state
    handlers = OpenAIHandlers(state)
    server = state.server
    app.add_middleware(AuthMiddleware, api_key=server.api_key, internal_key=server.internal_key,
                       is_kv_plane=kv_plane.is_kv_plane, admin_key=server.admin_key, is_admin=admin_rule(server),
                       router_only=server.router_only)
    app.add_middleware(CountMiddleware, metrics=state.metrics)  # outermost: refusals are counted too

    install_error_handlers(app, "replica")
    install_shared_routes(app, state.renderer, state.check_model, lambda: state.model_name,
                          lambda http, req: kv_plane.check_transfer_params(state.server, http, req))
    app.add_api_route("/v1/completions", handlers.completions, methods=["POST"], response_model=None)
    app.add_api_route("/v1/chat/completions", handlers.chat, methods=["POST"], response_model=None)
    install_responses_routes(app, state, handlers)
    install_kv_routes(app, state)
    install_lora_routes(app, state.loras, state.frontend, state.renderer.run)

    open_server = server.api_key is None and server.admin_key is None and server.internal_key is None
    _install_model_cards(app, state, open_server)
    _install_engine_routes(app, state)
    _install_server_info(app, state, open_server)
    return app


def _install_model_cards(app: FastAPI, state: ServerState, open_server: bool) -> None:
    """GET /v1/models and /v1/models/{id}: the base model and its loaded adapters."""

    def cards(http: Request) -> list:  # host paths (root) for the router and the operator only
        max_model_len = state.engine_client.max_model_len
        paths = open_server or is_operator(http.scope)
        card = ModelCard(id=state.model_name, root=state.model_path if paths else state.model_name,
                           max_model_len=max_model_len)
        return ModelList(data=[card, *state.loras.cards(max_model_len, paths)]).model_dump()["data"]

    @app.get("/v1/models")
    async def models(http: Request):
        return {"object": "list", "data": cards(http)}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, http: Request):
        return card_named(cards(http), model_id)


def _install_engine_routes(app: FastAPI, state: ServerState) -> None:
    """The engine's health, metrics, load and prefix cache reset (vLLM's paths, and kvmesh's /load)."""

    async def health():
        reason = state.engine_client.dead_reason()
        if reason is not None:  # "what: detail" -- the detail (an exception's text) is the log's, not the answer's
            what = reason.split(": ", 1)[0]
            return error_response(ProtocolError(f"replica is not healthy: {what} (its log has the details)", 503))
        return Response(status_code=200)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/ping", health, methods=["GET", "POST"])  # vLLM's alias (SageMaker-style probes)

    @app.get("/metrics")
    async def metrics(request: Request):
        return state.metrics.response(request.headers.get("accept"))

    @app.post(RESET_PREFIX_CACHE_PATH)
    async def reset_prefix_cache():
        freed = await state.engine_client.reset_prefix_cache()
        if state.load_publishing is not None:  # the intake it publishes described the blocks now gone
            state.load_publishing.cache_reset()
        logger.info("prefix cache reset: %d blocks freed", freed)
        return {"freed_blocks": freed}

    @app.get("/load")
    async def load():
        return state.engine_client.load_report().to_dict()

    @app.get("/get_load")
    async def get_load():
        report = state.engine_client.load_report()
        return [{"dp_rank": 0, "num_reqs": report.num_requests_running + report.num_requests_waiting,
                 "num_waiting_reqs": report.num_requests_waiting, "num_tokens": report.num_waiting_prefill_tokens}]


def _install_server_info(app: FastAPI, state: ServerState, open_server: bool) -> None:
    """/server_info and /model_info (and vLLM's /get_ aliases): host paths for the router and the operator only."""

    async def server_info(http: Request):  # host paths for the router and the operator only, as /v1/models
        return state.server_info(paths=open_server or is_operator(http.scope))

    async def model_info(http: Request):
        return state.model_info(paths=open_server or is_operator(http.scope))

    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, server_info, methods=["GET"], response_model=None)
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, model_info, methods=["GET"], response_model=None)
