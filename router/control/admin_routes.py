"""The router's replica-set routes: list, register, drain and remove replicas, and the fleet (admin plane).

    GET    /replicas[?drain_cost=true]   the replica set, in flight (and drain cost) per  } the admin key
                                         replica: its URLs, the fleet's layout            } only (403
    POST   /replicas                     register (or re-register) a replica              } without one)
    DELETE /replicas/{id}                remove one                                       }
    POST   /replicas/{id}/drain          stop routing new requests to it; running ones    }
                                         finish (inside ``kvmesh serve``: then its process is removed)
    POST   /v1/load_lora_adapter         learn a LoRA adapter, load it on its base's replicas } (adapter_loads.py)
    POST   /v1/unload_lora_adapter       unload it everywhere                                }
    POST   /reset_prefix_cache           every replica resets its prefix cache (prefix_cache_reset.py)
    GET    /admin/fleet, POST /admin/scale, /admin/rollout
                                         the process set, when the router runs inside ``kvmesh serve``

``is_admin_request`` is the one rule of which requests are the admin plane (the auth middleware uses it);
``answered_by_owner`` the part of it serve's workers pass to the control router, which owns the replica set
(a worker answers ``GET /replicas`` with its own view).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI, Response
from fastapi import Request as AppRequest
from kvmesh.replica.openai.body import read_request
from kvmesh.replica.openai.prefix_cache_reset import RESET_PREFIX_CACHE_PATH
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.router.config import ReplicaSpec
from kvmesh.router.control.prefix_cache_reset import reset_every_replica
from kvmesh.router.control.rows import ReplicaList, ReplicaRow, replica_row
from kvmesh.router.control.runtime import Json, RouterRuntime
from kvmesh.router.replicas.roles import BOTH, ROLES
from kvmesh.router.routing.retention import exclusive_blocks
from pydantic import ConfigDict, Field, JsonValue


class ReplicaRegistration(OpenAIBaseModel):
    """``POST /replicas`` body: where a replica listens and its role (see ``ReplicaSpec``)."""

    model_config = ConfigDict(extra="forbid")
    url: str
    events: str | None = None
    replay: str | None = None
    id: str | None = None
    role: str = BOTH


class AdapterLoadRequest(OpenAIBaseModel):
    """``POST /v1/load_lora_adapter`` body (vLLM's, and the base model when the router serves several)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    base_model_name: str | None = None
    """The base model the adapter adapts (needed only while the router serves several)."""


class AdapterUnloadRequest(OpenAIBaseModel):
    """``POST /v1/unload_lora_adapter`` body (vLLM's)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


class ScaleRequest(OpenAIBaseModel):
    """``POST /admin/scale`` body."""

    model_config = ConfigDict(extra="forbid")
    replicas: int
    role: str | None = None
    """Scale the replicas of this role (``prefill``); none: the replicas that serve requests."""
    deployment: str | None = None
    """Scale this deployment's replicas (a cluster of several models, ``kvmesh scale N --deployment D``)."""


class RolloutRequest(OpenAIBaseModel):
    """``POST /admin/rollout`` body: engine settings the restarted replicas get (none: same settings)."""

    model_config = ConfigDict(extra="forbid")
    engine: dict[str, JsonValue] = {}
    deployment: str | None = None
    """Restart only this deployment's replicas (a cluster of several models)."""


ADAPTER_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
"""vLLM's runtime adapter endpoints: on the router they load on (unload from) the replicas (adapter_loads.py)."""


def is_admin_request(method: str, path: str) -> bool:
    """The admin plane: the replica set (reading it too: it names the replicas' URLs), everything under /admin/,
    loading and unloading LoRA adapters, resetting the replicas' prefix caches."""
    return (path.startswith("/admin/") or path == "/replicas" or path.startswith("/replicas/") or path in ADAPTER_PATHS
            or path == RESET_PREFIX_CACHE_PATH)


def answered_by_owner(method: str, path: str) -> bool:
    """Admin requests the replica set's owner answers: changes to the set, and everything under /admin/."""
    return path.startswith("/admin/") or (method not in ("GET", "HEAD") and is_admin_request(method, path))


def install_replica_routes(app: FastAPI, runtime: RouterRuntime) -> None:
    """Add the routes of the module doc to the router's app."""
    _install_replica_set(app, runtime)
    _install_fleet(app, runtime)
    _install_adapters_and_cache(app, runtime)


def _replica_rows(runtime: RouterRuntime) -> list[ReplicaRow]:
    """One row per registered replica, each from its record: where it listens, its role, health, load and models."""
    runtime.router.loads.refresh()  # the other router processes' in-flight counts
    now = runtime.outliers.clock()
    return [replica_row(replica, now) for replica in runtime.replicas]


def _install_replica_set(app: FastAPI, runtime: RouterRuntime) -> None:
    """GET/POST /replicas, POST /replicas/{id}/drain, DELETE /replicas/{id}."""

    @app.get("/replicas")
    async def list_replicas(drain_cost: bool = False) -> Response:
        rows = _replica_rows(runtime)
        if drain_cost:  # blocks only this replica holds: what draining it would cost (a walk over the index)
            exclusive = await asyncio.to_thread(exclusive_blocks, runtime.router)
            for row in rows:
                row.exclusive_blocks = exclusive.get(row.id, 0)
        waiting = 0 if runtime.admission is None else runtime.admission.admission.waiting()
        return Response(ReplicaList(rows, waiting).encode(), media_type="application/json")

    @app.post("/replicas/{replica_id}/drain")
    async def drain_replica(replica_id: str):
        replica = runtime.replicas.get(replica_id)
        if replica is None:
            raise ProtocolError(f"no replica {echo(replica_id)!r}; GET /replicas lists them", 404)
        try:  # the fleet may refuse (its last replica) before anything changes
            removing = runtime.fleet is not None and runtime.fleet.request_remove(replica_id)
        except ValueError as e:
            raise ProtocolError(str(e), 409) from None
        runtime.drain(replica)
        answer = {"id": replica_id, "draining": True, "in_flight": runtime.in_flight(replica),
                  "will_be_removed": bool(removing)}
        if removing:  # serve's replica count drops by one for good (until a scale or the autoscaler)
            answer["target"] = runtime.fleet.target
        return answer

    @app.post("/replicas")
    async def add_replica(request: AppRequest):
        body = await read_request(request, ReplicaRegistration, runtime.config.frontend, runtime.renderer.run)
        try:
            spec = ReplicaSpec(url=body.url, events=body.events, replay=body.replay, replica_id=body.id or "",
                               role=body.role)
        except ValueError as e:
            raise ProtocolError(f"bad replica registration: {echo(str(e))}; send "
                                '{"url": "http://HOST:PORT", "events": "tcp://...", "replay": "tcp://...", '
                                f'"id": "name", "role": "{"|".join(ROLES)}"}}') from None
        return {"id": spec.replica_id, "healthy": await runtime.probes.probe(runtime.add_replica(spec))}

    @app.delete("/replicas/{replica_id:path}")
    async def delete_replica(replica_id: str):
        if not runtime.remove_replica(replica_id):
            raise ProtocolError(f"no replica {echo(replica_id)!r}; GET /replicas lists them", 404)
        return {"id": replica_id, "removed": True}


def _install_fleet(app: FastAPI, runtime: RouterRuntime) -> None:
    """GET /admin/fleet, POST /admin/scale and /admin/rollout: serve's process set."""
    cfg = runtime.config

    def fleet():
        if runtime.fleet is None:
            raise ProtocolError("this router does not run replica processes (only `kvmesh serve` does); "
                                "register and remove replicas with POST/DELETE /replicas", 501)
        return runtime.fleet

    @app.get("/admin/fleet")
    async def fleet_state():
        return fleet().state()

    def ask_fleet(ask: Callable[[], Json]) -> Json:
        """The fleet's answer; a refused ask is a 400 (bad value) or a 409 (busy)."""
        try:
            return ask()
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        except RuntimeError as e:
            raise ProtocolError(str(e), 409) from None

    @app.post("/admin/scale")
    async def scale(request: AppRequest):
        body = await read_request(request, ScaleRequest, cfg.frontend, runtime.renderer.run)
        return ask_fleet(lambda: fleet().request_scale(body.replicas, body.role, body.deployment))

    @app.post("/admin/rollout")
    async def rollout(request: AppRequest):
        body = await read_request(request, RolloutRequest, cfg.frontend, runtime.renderer.run)
        return ask_fleet(lambda: fleet().request_rollout(body.engine, body.deployment))


def _install_adapters_and_cache(app: FastAPI, runtime: RouterRuntime) -> None:
    """vLLM's LoRA adapter endpoints and /reset_prefix_cache, answered across the replicas."""
    cfg = runtime.config

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: AppRequest):
        body = await read_request(request, AdapterLoadRequest, cfg.frontend, runtime.renderer.run)
        return await runtime.adapters.admin_load(body.lora_name, body.lora_path, body.base_model_name)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: AppRequest):
        body = await read_request(request, AdapterUnloadRequest, cfg.frontend, runtime.renderer.run)
        return await runtime.adapters.admin_unload(body.lora_name)

    @app.post(RESET_PREFIX_CACHE_PATH)
    async def reset_prefix_cache():
        specs = [r.spec for r in runtime.replicas if r.spec is not None]
        return {"replicas": await reset_every_replica(specs, runtime.calls)}
