"""LoRA adapters the router loads on replicas: before routing a request there, and when an admin asks.

A request for an adapter may go to a replica of its base model that lacks it (its pool, router/routing/
model_pools.py; ``upstream.load_missing_adapters``). The router first asks that replica to load it, with the
cluster's internal key, through vLLM's endpoint::

    POST {replica}/v1/load_lora_adapter   {"lora_name": NAME, "lora_path": PATH}

One load per (replica, adapter) at a time: concurrent requests wait for the same call. A load is bounded by
``upstream.adapter_load_timeout_s``; one that fails (an error status, a timeout, no answer) raises
``AdapterLoadError`` with the replica's reason, and the proxy tries another replica of the pool.

The router learns adapters (name -> path, base model) from the replicas' reports and from its own admin
endpoint, the same shape with the admin key (``kvmesh lora load NAME PATH [--deployment D]`` calls it)::

    POST {router}/v1/load_lora_adapter    {"lora_name", "lora_path", "base_model_name"?}  load it on every
                                          healthy replica of the base (the only base when not named)
    POST {router}/v1/unload_lora_adapter  {"lora_name"}  unload it from every replica that has it, forget it
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.router.http.upstream import UpstreamError
from kvmesh.router.routing.model_pools import AdapterLoadError

if TYPE_CHECKING:
    from kvmesh.router.control.models import RouterModels
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.replicas.replica_set import ReplicaSet
    from kvmesh.router.routing.model_pools import ModelPool

logger = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"


class AdapterLoads:
    """Loads (and unloads) adapters on replicas; see the module doc."""

    def __init__(self, replicas: ReplicaSet, calls: ReplicaCalls, models: RouterModels) -> None:
        """``replicas``: the router's set; ``calls``: its client of control calls; ``models``: what each serves."""
        self.replicas, self.calls = replicas, calls
        self.models = models
        self._loading: dict[tuple[Replica, str], asyncio.Task] = {}
        self.loads = 0
        """Adapter loads the router asked replicas for (routed requests and admin calls)."""

    def needs_load(self, replica: Replica, pool: ModelPool | None) -> bool:
        """Whether a request of ``pool`` routed to ``replica`` must load its adapter there first."""
        if pool is None or pool.lora_name is None or replica.id in pool.holders:
            return False
        served = None if replica.removed else replica.served
        return served is None or pool.lora_name not in served.adapters

    async def ensure(self, replica: Replica, pool: ModelPool) -> None:
        """Load the pool's adapter on ``replica`` unless it has it; AdapterLoadError when that fails."""
        if not self.needs_load(replica, pool):
            return
        if pool.lora_path is None:
            raise AdapterLoadError(f"adapter `{pool.lora_name}` has no known path to load it from")
        await self.load(replica, pool.lora_name, pool.lora_path)

    async def load(self, replica: Replica, name: str, path: str) -> None:
        """One load of ``name`` on ``replica`` (concurrent callers share it); AdapterLoadError on failure."""
        key = (replica, name)
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.ensure_future(self._call(replica, LOAD_PATH,
                                                                         {"lora_name": name, "lora_path": path}))
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        await asyncio.shield(task)
        self.models.catalog.add_adapter(replica, name, path)

    async def _call(self, replica: Replica, path: str, body: dict[str, str]) -> None:
        spec, replica_id = replica.spec, replica.id
        if spec is None or replica.removed:
            raise AdapterLoadError(f"replica {replica_id} is no longer registered")
        timeout_s = self.calls.upstream.adapter_load_timeout_s
        headers = {"content-type": "application/json", **self.calls.headers()}
        if path == LOAD_PATH:
            self.loads += 1
        try:
            status, _, raw = await self.calls.control.fetch("POST", spec.url, path, timeout_s,
                                                        msgspec.json.encode(body), headers)
        except asyncio.TimeoutError:
            raise AdapterLoadError(f"replica {replica_id} did not answer {path} within {timeout_s:g} s "
                                   "(upstream.adapter_load_timeout_s)") from None
        except (UpstreamError, OSError) as e:
            raise AdapterLoadError(f"replica {replica_id} could not be reached for {path}: {e}") from None
        if status != 200:
            raise AdapterLoadError(f"replica {replica_id} answered {path} with HTTP {status}: {_message(raw)}",
                                   status)
        logger.info("replica %s: %s %s", replica_id, path, body["lora_name"])

    # ---------------------------------------------------------------- the admin endpoints
    async def admin_load(self, name: str, path: str, base: str | None) -> dict:
        """``POST /v1/load_lora_adapter`` on the router: learn the adapter, load it on every healthy replica of
        its base (ProtocolError: several bases and none named, an unknown base, every load failed)."""
        catalog = self.models.catalog
        bases = catalog.bases()
        if base is None and len(bases) > 1:
            raise ProtocolError(f"this router serves several base models ({', '.join(bases)}): name the adapter's "
                                "in `base_model_name`", 400, param="base_model_name")
        if base is not None and bases and base not in bases:
            raise ProtocolError(f"The model `{echo(base)}` does not exist; this router serves {', '.join(bases)}",
                                404, param="base_model_name")
        if name in bases:
            raise ProtocolError(f"`{echo(name)}` is a base model's name; give the adapter another", 400,
                                param="lora_name")
        base = base or (bases[0] if bases else None)
        holding = catalog.base_holding(name)
        if holding is not None and base is not None and holding != base:
            raise ProtocolError(f"adapter `{echo(name)}` belongs to base model `{holding}` on this router (one adapter "
                                f"name, "
                                f"one base model); unload it first or load this one under another name", 409,
                                param="lora_name")
        catalog.learn_adapter(name, path, base)
        serving = catalog.replicas_of(base) if base is not None else ()
        targets = sorted((r for r in self.replicas if r.healthy and r.id in serving), key=lambda r: r.id)
        results = await asyncio.gather(*(self.load(r, name, path) for r in targets), return_exceptions=True)
        failed = {r.id: str(e) for r, e in zip(targets, results, strict=True) if isinstance(e, BaseException)}
        if targets and len(failed) == len(targets):
            catalog.forget_adapter(name)
            refused = [r.status for r in results if isinstance(r, AdapterLoadError) and r.status in (400, 404, 409)]
            status = refused[0] if len(refused) == len(targets) else 502  # every replica refused it: its reason, as is
            raise ProtocolError(f"adapter `{echo(name)}` did not load on any replica: " + "; ".join(failed.values()),
                                status, param="lora_path" if status == 400 else None)
        return {"lora_name": name, "lora_path": path, "base_model_name": base,
                "loaded_on": [r.id for r in targets if r.id not in failed], "failed": failed}

    async def admin_unload(self, name: str) -> dict:
        """``POST /v1/unload_lora_adapter`` on the router: unload it from every replica that has it, forget it."""
        catalog = self.models.catalog
        if name not in catalog.adapters():
            raise ProtocolError(f"The model `{echo(name)}` does not exist (no adapter of that name is loaded)", 404,
                                param="lora_name")
        holding = {rid for rid, s in catalog.served.items() if name in s.adapters}
        holders = sorted((r for r in self.replicas if r.id in holding), key=lambda r: r.id)
        results = await asyncio.gather(*(self._call(r, UNLOAD_PATH, {"lora_name": name}) for r in holders),
                                       return_exceptions=True)
        catalog.forget_adapter(name)
        failed = {r.id: str(e) for r, e in zip(holders, results, strict=True) if isinstance(e, BaseException)}
        return {"lora_name": name, "unloaded_from": [r.id for r in holders if r.id not in failed], "failed": failed}


def _message(raw: bytes) -> str:
    """An error answer's message (OpenAI-shaped or not), short."""
    try:
        body = msgspec.json.decode(raw)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("message", ""))[:300]
    except msgspec.DecodeError:
        pass
    return raw[:300].decode("utf-8", "replace")
