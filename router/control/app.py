"""The router's FastAPI app: every path the door does not answer itself (router/http/door.py).

    POST /tokenize, /v1/completions/render, /v1/chat/completions/render, GET /version
                                     shared with the replica (replica/openai/routes.py)
    GET  /v1/models                  every base model and adapter served, vLLM's card (router/control/models.py)
    GET  /v1/models/{id}             one of them; a 404 naming what is served
    GET  /health, /ping              200 when >= 1 replica is healthy, else 503
    GET  /get_load                   the router's in-flight requests (SGLang's shape)
    GET  /metrics                    Prometheus (router/http/metrics.py; the replicas' vllm:* series: fleet_metrics.py)
    /replicas..., /admin/...         the replica set and the admin plane (admin_routes.py)

Auth is one rule (replica/openai/auth.py): the app's middleware and the door's proxied routes both apply it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi import Request as AppRequest
from fastapi.responses import JSONResponse
from kvmesh.replica.openai.auth import AuthMiddleware, is_operator
from kvmesh.replica.openai.errors import install_error_handlers
from kvmesh.replica.openai.metrics_exposition import metrics_response
from kvmesh.replica.openai.responses import card_named
from kvmesh.replica.openai.routes import install_shared_routes
from kvmesh.replica.serving.errors import ProtocolError, error_body
from kvmesh.router.admission.tenants import Tenants
from kvmesh.router.config import RouterConfig
from kvmesh.router.control.admin_routes import install_replica_routes, is_admin_request
from kvmesh.router.control.runtime import RouterRuntime
from kvmesh.router.http.router_only import refuse_router_only


def served_model(cfg: RouterConfig) -> str:
    """The model name the router answers with (``served_model_name``, else the model or tokenizer path)."""
    return cfg.served_name or cfg.model or cfg.tokenizer or "kvmesh"


def error_counter(runtime: RouterRuntime) -> Callable[[ProtocolError], None]:
    """Counts an error answer in the router's request metric, by status class."""
    def count_error(e: ProtocolError) -> None:
        runtime.metrics.requests.labels(f"{e.status_code // 100}xx").inc()

    return count_error


def auth_rule(cfg: RouterConfig, tenants: Tenants | None = None) -> AuthMiddleware:
    """The one auth rule: the API key (or a key of the admission keys file) for tenants, the admin key for the
    admin plane."""
    return AuthMiddleware(None, api_key=cfg.api_key, admin_key=cfg.admin_key, is_admin=is_admin_request,
                          tenant_key=tenants.holds_header if tenants is not None and tenants.has_keys else None)


def build_app(runtime: RouterRuntime) -> FastAPI:
    """The app (see the module doc); its lifespan starts and stops ``runtime``."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="kvmesh router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    cfg = runtime.config
    count_error = error_counter(runtime)
    rule = auth_rule(cfg, runtime.tenants)
    app.add_middleware(AuthMiddleware, api_key=cfg.api_key, admin_key=cfg.admin_key, is_admin=is_admin_request,
                       on_refused=count_error, tenant_key=rule.tenant_key)
    install_error_handlers(app, "router", on_error=count_error)
    model_name = served_model(cfg)
    install_shared_routes(app, runtime.renderer, runtime.check_model, lambda: model_name,
                          lambda http, req: refuse_router_only(req))

    @app.get("/v1/models")
    async def models(http: AppRequest):  # every base model, then every adapter (its parent: its base); host paths
        return {"object": "list", "data": runtime.models.cards(paths=is_operator(http.scope))}  # for the admin only

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, http: AppRequest):
        return card_named(runtime.models.cards(paths=is_operator(http.scope)), model_id)

    async def health():
        healthy = sorted(map(str, runtime.router.healthy))
        feed = runtime.feed_state()
        body = {"status": "ok" if healthy else "unavailable", "healthy_replicas": healthy,
                "replicas": sum(r.spec is not None for r in runtime.replicas), "event_feed": feed,
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
        loads = [replica.load for replica in runtime.replicas]
        return [{"dp_rank": 0, "num_reqs": sum(load.in_flight for load in loads), "num_waiting_reqs": 0,
                 "num_tokens": sum(load.pending_prefill_tokens for load in loads)}]

    @app.get("/metrics")
    async def metrics(request: AppRequest):
        await runtime.refresh_fleet_metrics()  # the replicas' vllm:* series, labelled by replica
        return metrics_response(runtime.metrics.registry, request.headers.get("accept"))  # OpenMetrics if accepted

    install_replica_routes(app, runtime)
    return app
