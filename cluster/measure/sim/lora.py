"""LoRA adapters and several base models in the simulator.

A simulated replica holds ``max_loras`` device slots of adapter weights (``LoRASlots``), as vLLM's engine:
one step batches requests of the base model and of at most ``max_loras`` distinct adapters; a waiting request
of another adapter is passed over (later requests of adapters already running go first, as vLLM's scheduler
skips it) until a slot frees. An adapter not in a slot is loaded into the least recently used free one when its
first request is admitted, and that step waits ``lora_bytes / lora_load_bytes_per_s`` seconds for it. Every adapter
is known to every replica (kept in host memory); ``/load``'s ``lora`` section (``LoRALoad``) says which are
resident, which active, their sizes and the load rate, so the router's cost can price a load where the adapter
is not resident.

Adapter affinity on or off (``SimLoRAConfig.adapter_aware``):

- *aware* (the real router): the router gets each request's ``lora_name`` (``KVRouter.route``), so its keys are
  the engine's (the adapter in every block's hash) and it matches the adapter's cached prefixes; the replicas'
  ``/load`` carries the ``lora`` section.
- *blind*: a router that knows nothing of adapters, as one in front of an engine it does not understand: it
  routes with ``lora_name`` hidden (its keys are the base model's, so the replicas' adapter blocks, keyed by
  the adapter, never match an adapter prompt) and the replicas' ``/load``
  has no ``lora`` section (nothing about residency). Base-model prompts match as before.

Several base models (``ModelPools``): each replica serves one base model (the workload's models split the
replicas in contiguous equal shares); a request is routed among its model's replicas only (the others are
excluded in ``KVRouter.route``, as the HTTP router's pools by ``"model"``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from kvmesh.cluster.measure.sim.lora_config import SimLoRAConfig
from kvmesh.replica.serving.load_report import LoRALoad
from kvmesh.router.replicas.load import ReplicaLoad

if TYPE_CHECKING:
    from kvmesh.cluster.measure.sim.request import SimRequest
    from kvmesh.cluster.measure.workloads.traces import MooncakeRecord

class LoRASlots:
    """One replica's device slots: which adapters are resident (LRU), what their loads cost, who waited."""

    def __init__(self, config: SimLoRAConfig) -> None:
        self.config = config
        self.resident: OrderedDict[str, None] = OrderedDict()
        """Adapters in a device slot, least recently used first (at most ``max_loras``)."""
        self.known: set[str] = set()
        """Adapters the replica was asked for (kept in host memory): /load's ``adapters``."""
        # -- measured --
        self.num_loads = 0
        self.load_s = 0.0
        self.waited: set[str] = set()
        """Requests passed over at least once because every slot held another running adapter."""

    def fits(self, req: SimRequest, running: Iterable[SimRequest]) -> bool:
        """Whether ``req`` may join a batch of ``running``: no adapter, one already running, or a slot left."""
        name = req.lora_name
        if name is None:
            return True
        active = {r.lora_name for r in running if r.lora_name is not None}
        if name in active or len(active) < self.config.max_loras:
            return True
        self.waited.add(req.request_id)
        return False

    def admit(self, req: SimRequest, running: Iterable[SimRequest]) -> float:
        """``req`` joins the batch (after ``fits``): seconds its step waits to load the adapter (0: resident)."""
        name = req.lora_name
        if name is None:
            return 0.0
        self.known.add(name)
        if name in self.resident:
            self.resident.move_to_end(name)
            return 0.0
        if len(self.resident) >= self.config.max_loras:
            active = {r.lora_name for r in running}
            victim = next((n for n in self.resident if n not in active), None)
            if victim is None:  # fits() keeps a slot of a non-running adapter free: cannot happen
                raise RuntimeError(f"no free LoRA slot for {name}: {len(self.resident)} running adapters")
            del self.resident[victim]
        self.resident[name] = None
        self.num_loads += 1
        self.load_s += self.config.load_s
        return self.config.load_s

    def section(self, running: Sequence[SimRequest]) -> LoRALoad:
        """``/load``'s ``lora`` section now."""
        cfg = self.config
        return LoRALoad(enabled=True, max_loras=cfg.max_loras, max_lora_rank=cfg.max_lora_rank,
                        adapters=dict.fromkeys(sorted(self.known), cfg.lora_bytes), resident=list(self.resident),
                        active=sorted({r.lora_name for r in running if r.lora_name is not None}),
                        load_bytes_per_s=cfg.lora_load_bytes_per_s)


ROUTER_READS_LORA = "lora" in {f.name for f in fields(ReplicaLoad)}
"""Whether the router's ``ReplicaLoad`` holds the ``lora`` section (helper ``cost``'s
field, the adapter load's price)."""


def report_lora(load: ReplicaLoad, section: LoRALoad | None) -> None:
    """Hand a polled ``lora`` section to the router's view of the replica (None: the replica reports none)."""
    if ROUTER_READS_LORA:
        load.lora = section


def with_adapters(requests: list[SimRequest], records: Sequence[MooncakeRecord]) -> list[SimRequest]:
    """The requests with the adapter and base model their records name (``requests_from_mooncake``'s order)."""
    from kvmesh.cluster.measure.workloads.adapters import AdapterRecord

    for req, rec in zip(requests, records, strict=True):
        if isinstance(rec, AdapterRecord):
            req.lora_name, req.model = rec.lora_name, rec.model
    return requests


class ModelPools:
    """Which base model each replica serves: the requests' models split the replicas in contiguous shares."""

    def __init__(self, models: Sequence[str], replica_ids: Sequence[str]) -> None:
        if len(models) > len(replica_ids):
            raise ValueError(f"{len(models)} base models need at least as many replicas; there are {len(replica_ids)}")
        n, m = len(replica_ids), max(1, len(models))
        self.model_of = {rid: models[k * m // n] for k, rid in enumerate(replica_ids)} if models else {}
        self._exclude: dict[str, frozenset[int]] = {}

    @classmethod
    def of(cls, requests: Iterable[SimRequest], replica_ids: Sequence[str]) -> ModelPools:
        """Pools for the base models ``requests`` name (none when they name at most one)."""
        models = sorted({r.model for r in requests if r.model is not None})
        return cls(models if len(models) > 1 else [], replica_ids)

    def exclude(self, model: str | None) -> frozenset[int]:
        """The replicas a request of ``model`` must not go to (none with one model)."""
        if model is None or not self.model_of:
            return frozenset()
        out = self._exclude.get(model)
        if out is None:
            out = self._exclude[model] = frozenset(r for r, m in self.model_of.items() if m != model)
        return out


def lora_summary(reqs: Sequence[SimRequest], slots: Sequence[LoRASlots]) -> dict:
    """What the adapters cost in a run (its requests, its replicas' slots): loads into slots, their seconds,
    requests that waited for a slot."""
    adapter_reqs = [r for r in reqs if r.lora_name is not None]
    if not adapter_reqs:
        return {}
    loads = sum(s.num_loads for s in slots)
    per_replica = [len(s.known) for s in slots]
    return {"lora": {
        "adapter_requests": len(adapter_reqs),
        "adapters": len({r.lora_name for r in adapter_reqs}),
        "adapter_loads": loads,
        "adapter_loads_per_request": loads / len(adapter_reqs),
        "adapter_load_s": sum(s.load_s for s in slots),
        "slot_waits": sum(len(s.waited) for s in slots),
        "slot_wait_share": sum(len(s.waited) for s in slots) / len(adapter_reqs),
        "adapters_per_replica_mean": sum(per_replica) / len(per_replica),
        "adapters_per_replica_max": max(per_replica),
    }}
