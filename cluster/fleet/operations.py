"""A running cluster's replica set changed at runtime: add, drain + remove, scale to N, rolling restart.

    add:      placement group ─▶ started ─▶ ready ─▶ registered ─▶ healthy in the router (replica_add.py)
    remove:   router drain ─▶ its requests finish ─▶ deregistered ─▶ stopped ─▶ group freed (replica_remove.py)
    rollout:  per old replica: add one of its role (new engine settings, if any) ─▶ gate ─▶ remove the old one

Per role (cluster/config/roles.py): scale counts and changes one role's replicas (``--role prefill``, or the
serving ones: decode, or both in a cluster without prefill replicas); the last replica that decodes is never
drained (prefill replicas alone serve nothing); the autoscaler follows the load with the serving replicas only
(prefill replicas are scaled by the operator: their load is the long prompts, not the requests in flight).

One worker thread runs the operations in order (``request_scale``/``request_rollout`` queue them and
return at once; the router's ``/admin/*`` endpoints call them). With ``autoscale.scale_with_load`` a second
thread (``autoscale_loop.py``) hands what the autoscaler decides to ``apply``, which queues it.
On a real Ray cluster a placement group no node can hold stays pending, which is what the Ray
autoscaler scales GPU nodes on (deploy/README.md).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.cluster.config.gpu_share import check_gpu_share
from kvmesh.cluster.config.roles import Role, decodes, serving_role
from kvmesh.cluster.fleet.autoscaler import Decision, cheapest_to_lose
from kvmesh.cluster.fleet.replica_add import add_replicas
from kvmesh.cluster.fleet.replica_remove import remove_replica
from kvmesh.cluster.fleet.view import Accepted, EngineChanges, FleetView, Operation
from kvmesh.cluster.launch.capacity import plan_capacity
from kvmesh.cluster.launch.placement import cluster_nodes
from kvmesh.cluster.launch.supervisor import ReplicaHandle, replica_index
from kvmesh.router.replicas.roles import PREFILL, check_role

if TYPE_CHECKING:
    from kvmesh.cluster.launch.serve_state import RunningCluster, ServeState
    from kvmesh.replica.config import EngineConfig

logger = logging.getLogger(__name__)


def one_model(deployment: str | None) -> None:
    """A one-model cluster has no deployments to name (ValueError when one is named)."""
    if deployment is not None:
        raise ValueError(f"this cluster runs one model, no deployments: drop --deployment {deployment}")


class Fleet:
    """See the module doc. ``cluster`` is the running ``ServeCluster``."""

    def __init__(self, cluster: RunningCluster) -> None:
        self.cluster = cluster
        self.config = cluster.config.autoscale
        self.decisions: deque[Decision] = deque(maxlen=50)
        """The autoscaler's last decisions (``apply`` appends them)."""
        self.operations: deque[Operation] = deque(maxlen=50)
        """Finished operations: what, when, how long, outcome."""
        self.busy: str | None = None
        self._removing: set[str] = set()
        """Replicas being drained to be removed (one removal each)."""
        self.serving_role: Role = serving_role(cluster.config.replicas.num_prefill_replicas)
        """The role of the replicas that serve requests (decode next to prefill replicas, else both)."""
        self.target = len(self.replica_ids(self.serving_role))
        """Serving replicas wanted (scale, drain, the autoscaler)."""
        self.prefill_target = len(self.replica_ids(PREFILL))
        """Prefill replicas wanted."""
        self._last_index = max((replica_index(h.replica_id) for h in cluster.state.replicas), default=-1)
        """The highest replica index this cluster has used (from its start on): names are never reused."""
        self._ops: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name="kvmesh-fleet", daemon=True)]
        self._metrics()
        if self.config.scale_with_load:
            from kvmesh.cluster.fleet.autoscale_loop import AutoscaleLoop
            from kvmesh.cluster.launch.node_routers import NodeRouters

            router = self.st.router  # routers serve placed on Ray nodes hold requests of their own
            placed = router.ask_waiting if isinstance(router, NodeRouters) else (lambda: ())
            loop = AutoscaleLoop(self.config, self.st.router_client, router.runtime.metrics.registry, placed)
            self._threads.append(threading.Thread(target=loop.run, args=(self._stop, self.idle, self.serving_ids,
                                                  self.apply), name="kvmesh-autoscaler", daemon=True))

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Fleet:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def st(self) -> ServeState:
        return self.cluster.state

    def replica_ids(self, role: Role | None = None) -> list[str]:
        """Every replica, or those of ``role`` (decode and both: the serving ones)."""
        return [h.replica_id for h in list(self.st.replicas)
                if role is None or (h.role == PREFILL) == (role == PREFILL)]

    def serving_ids(self) -> list[str]:
        """The replicas that serve requests to their end (the autoscaler's)."""
        return self.replica_ids(self.serving_role)

    def idle(self) -> bool:
        return self.busy is None and self._ops.empty()

    # ------------------------------------------------------------------ requests (router /admin/*)
    def state(self) -> FleetView:
        return {"replicas": self.replica_ids(), "roles": {h.replica_id: h.role for h in list(self.st.replicas)},
                "target": self.target, "prefill_target": self.prefill_target, "busy": self.busy,
                "queued": self._ops.qsize(), "autoscale": {
                    "enabled": self.config.scale_with_load, "min_replicas": self.config.min_replicas,
                    "max_replicas": self.config.max_replicas, "target_in_flight": self.config.target_in_flight,
                    "target_queued_prefill_tokens": self.config.target_queued_prefill_tokens},
                "decisions": [d.as_dict() for d in self.decisions], "operations": list(self.operations)}

    def request_scale(self, replicas: int, role: str | None = None, deployment: str | None = None) -> Accepted:
        """Queue "scale ``role`` to N" (role None: the serving replicas); ValueError when N is out of bounds or the
        role is unknown (``deployment``: a cluster of deployments', deployment_fleet.py)."""
        one_model(deployment)
        role = PREFILL if check_role(role or self.serving_role) == PREFILL else self.serving_role
        others = len(self.st.replicas) - len(self.replica_ids(role))  # the other role's replicas hold nodes too
        low, high = (0 if role == PREFILL else 1), max(1, self.capacity() - others)
        why = "what the Ray cluster's nodes hold; serve --wait-for-nodes lifts this where a Ray autoscaler adds nodes"
        if self.config.scale_with_load and role != PREFILL:
            low, high, why = self.config.min_replicas, self.config.max_replicas, "autoscale.min/max_replicas"
        if role == PREFILL and replicas and not self.st.kv_transfer.enabled:
            raise ValueError(f"cannot start prefill replicas: this cluster's replicas run without KV transfer "
                             f"(replicas."
                             f"kv_transfer={self.cluster.config.replicas.kv_transfer}; auto is on only when serve "
                             f"starts with "
                             "prefill replicas), and a prefill replica hands its KV over it: serve with --kv-transfer "
                             "on")
        what = f"{role} replicas" if role == PREFILL else "replicas"
        if not low <= replicas <= high:
            raise ValueError(f"cannot scale to {replicas} {what}: allowed {low}..{high} ({why})")
        operation = f"scale to {replicas}" + (f" {PREFILL}" if role == PREFILL else "")
        self.enqueue(operation, self.scale_to, replicas, role)
        return {"accepted": True, "operation": operation, "replicas": self.replica_ids(), "role": role}

    def capacity(self) -> int:
        """Most replicas the Ray cluster's nodes hold (capacity.py: each replica's GPUs on one node, CPUs);
        no limit here with ray.wait_for_nodes (a pending placement group makes the Ray autoscaler add a node)."""
        if self.cluster.config.ray.wait_for_nodes:
            return 1 << 10
        return max(1, plan_capacity(cluster_nodes(), self.cluster.replica_bundles(), 1).holds)

    def request_rollout(self, engine: EngineChanges | None = None, deployment: str | None = None) -> Accepted:
        """Queue a rolling restart; ``engine`` = EngineConfig fields the new replicas get (checked now).

        ValueError: bad settings; RuntimeError: a rollout is already under way."""
        one_model(deployment)
        if self.busy == "rollout" or any(op[0] == "rollout" for op in list(self._ops.queue)):
            raise RuntimeError("a rolling restart is already running; GET /admin/fleet shows its progress")
        new_engine = self.st.engine
        if engine:
            try:
                new_engine = replace(self.st.engine, **engine)
                check_gpu_share(self.cluster.config.replicas.gpus_per_replica, new_engine.tensor_parallel_size,
                                new_engine.gpu_memory_utilization)  # the running ones' share is explicit here
            except (TypeError, ValueError) as e:
                raise ValueError(f"bad engine settings {engine}: {e}") from None
        self.enqueue("rollout", self.rollout, new_engine)
        return {"accepted": True, "operation": "rollout", "replicas": self.replica_ids(),
                "engine_changes": sorted(engine or {})}

    def request_remove(self, replica_id: str) -> bool:
        """The router was told to drain a replica: remove its process once drained (False: not ours).
        ValueError when it is the last one that decodes not already leaving: a cluster never drops to 0 replicas
        that serve requests (prefill replicas alone finish none)."""
        handle = next((h for h in list(self.st.replicas) if h.replica_id == replica_id), None)
        if handle is None:
            return False
        staying = [r for r in self.serving_ids() if r != replica_id and r not in self._removing]
        if decodes(handle.role) and not staying and replica_id not in self._removing:
            what = "last replica" if len(self.st.replicas) == 1 else "last replica that decodes"
            raise ValueError(f"{replica_id} is this cluster's {what}: draining it would leave none to serve "
                             f"requests. Start another first (`kvmesh scale {len(self.serving_ids()) + 1}`), or stop "
                             "the cluster")
        if replica_id not in self._removing:
            self._removing.add(replica_id)
            if handle.role == PREFILL:
                self.prefill_target = max(0, self.prefill_target - 1)
            else:
                self.target = max(1, self.target - 1)
            self.enqueue(f"drain {replica_id}", self.remove_replica, replica_id)
        return True

    def enqueue(self, name: str, fn, *args) -> None:
        """Run ``fn(*args)`` on the fleet's worker thread, after what is queued before it."""
        self._ops.put((name, fn, args))

    def apply(self, decision: Decision, have: int) -> None:
        """Queue what an autoscaler decision calls for (``AutoscaleLoop``; ``have``: the replicas it saw)."""
        self.decisions.append(decision)
        self.cluster.report(f"autoscaler: {decision.describe()}")
        self.target = decision.target
        if decision.action == "up":
            self.enqueue(f"scale to {decision.target}", self.add_replicas, decision.target - have, self.serving_role)
        else:
            self.enqueue(f"drain {decision.victim}", self.remove_replica, decision.victim)

    # ------------------------------------------------------------------ operations
    def scale_to(self, replicas: int, role: Role) -> None:
        """``role``'s replicas (prefill, or the serving ones) to ``replicas``: new ones started, extra ones drained
        (the cheapest to lose first)."""
        if role == PREFILL:
            self.prefill_target = replicas
        else:
            self.target = replicas
        have = len(self.replica_ids(role))
        if have < replicas:
            self.add_replicas(replicas - have, role)
        while len(ids := self.replica_ids(role)) > replicas and not self._stop.is_set():
            rows = self.cluster.state.router_client.replicas(drain_cost=True)
            self.remove_replica(cheapest_to_lose([r for r in rows if r["id"] in ids]))

    def add_replicas(self, count: int, role: Role) -> list[ReplicaHandle]:
        """Start ``count`` replicas of ``role`` in new placement groups; returns once the router routes to them."""
        return add_replicas(self.cluster, self.new_indexes(count), role)

    def new_indexes(self, count: int) -> list[int]:
        """Indexes for ``count`` new replicas, above every one this cluster has used: never a removed replica's
        name, whose metrics (ROUTED, hits) and logs would be taken for the new one's."""
        st = self.st
        used = {g.replica_index for g in st.groups} | {replica_index(h.replica_id) for h in st.replicas}
        first = max(used | {self._last_index}) + 1
        self._last_index = first + count - 1
        return list(range(first, first + count))

    def remove_replica(self, replica_id: str) -> None:
        """Drain, wait for its requests, deregister (index dropped), stop the actor, free its group."""
        handle = next((h for h in self.st.replicas if h.replica_id == replica_id), None)
        if handle is None:
            raise ValueError(f"no replica {replica_id!r} in this cluster; it has {self.replica_ids()}")
        self._removing.add(replica_id)
        remove_replica(self.cluster, handle, self.config.drain_timeout_s)
        self._removing.discard(replica_id)

    def rollout(self, engine: EngineConfig) -> None:
        """Replace every replica, one at a time, by one of its role: a new one passes the health gate before an old
        one drains."""
        st = self.st
        old = [(h.replica_id, h.role) for h in list(st.replicas)]
        st.engine = engine
        for replica_id, role in old:
            if self._stop.is_set():
                return
            t0 = time.monotonic()
            (new,) = self.add_replicas(1, role)
            self.remove_replica(replica_id)
            self.cluster.report(f"rollout: {replica_id} -> {new.replica_id} in {time.monotonic() - t0:.1f}s")

    # ------------------------------------------------------------------ threads
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                name, fn, args = self._ops.get(timeout=0.2)
            except queue.Empty:
                continue
            self.busy, t0 = name, time.monotonic()
            outcome = "ok"
            try:
                fn(*args)
            except Exception as e:  # report, keep serving: the cluster is still running
                outcome = f"failed: {type(e).__name__}: {e}"
                logger.exception("fleet operation %r failed", name)
                self.cluster.report(f"{name} failed: {e}")
            finally:
                self.busy = None
                self.operations.append({"operation": name, "started": time.time() - (time.monotonic() - t0),
                                        "seconds": round(time.monotonic() - t0, 2), "outcome": outcome})
                self._replicas_gauge.set(len(self.st.replicas))
                self._target_gauge.set(self.target)

    def _metrics(self) -> None:
        from prometheus_client import Gauge

        registry = self.st.router.runtime.metrics.registry
        self._replicas_gauge = Gauge("kvmesh_fleet_replicas", "Replica processes serve runs", registry=registry)
        self._target_gauge = Gauge("kvmesh_fleet_target_replicas", "Replicas wanted (scale/autoscaler)",
                                   registry=registry)
        self._replicas_gauge.set(len(self.st.replicas))
        self._target_gauge.set(self.target)
