"""One replica as a Ray actor: engine (+ TP workers), KV event publisher and HTTP server on its node.

    ReplicaActor (Ray, max_restarts)
      ├─ LLMEngine on the AsyncLLM thread ── model runner (TP=1) | RayTPExecutor ──▶ TPWorker × N
      ├─ ZmqEventPublisher   PUB + replay/snapshot ROUTER (ephemeral ports on the node IP)
      ├─ HTTPServer          FastAPI app (server/app.py) on its own thread
      └─ watchdog thread     engine or TP group broken -> the process exits, Ray restarts it

A (re)started actor announces its empty cache as the first batch of its stream: seq 0 is
``[AllBlocksCleared()]``, so subscribers drop whatever they knew about the previous incarnation.
Whoever needs the replica asks ``endpoints()`` (HTTP URL, event endpoints, model, block size);
after a restart the ports may differ (when configured as 0), so ask again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kvmesh.events.config import PublisherConfig
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.kv_transfer.config import KVTransferConfig
from kvmesh.replica.openai.config import FrontendConfig
from kvmesh.replica.server.config import AUTO_HOST, ReplicaServerConfig

if TYPE_CHECKING:
    from kvmesh.replica.runtime import Endpoints
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    RayOption = float | str | bool | PlacementGroupSchedulingStrategy | None
    """A value of ``ray.remote(...).options(...)`` (num_cpus, num_gpus, name, scheduling_strategy, ...)."""

logger = logging.getLogger(__name__)


ACTOR_SERVER = ReplicaServerConfig(host=AUTO_HOST, port=0, event_port=0, replay_port=0)
"""An actor's default server section: this node's address, ephemeral ports (reported by ``endpoints()``)."""


@dataclass(slots=True)
class ReplicaOptions:
    """How one replica actor serves: the replica's config sections whole, plus what only an actor has."""

    engine: EngineConfig
    """The engine's section (model, cache, TP size, ...)."""
    server: ReplicaServerConfig = ACTOR_SERVER
    """Where it listens (host "auto": 127.0.0.1 on a one-node Ray cluster, the node IP otherwise), API key, name."""
    events: PublisherConfig = field(default_factory=PublisherConfig)
    """The KV event stream (its addresses come from ``server``)."""
    frontend: FrontendConfig = field(default_factory=FrontendConfig)
    """The OpenAI front's limits, chat template and read timeouts."""
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    """Moving KV to and from peer replicas (off by default; serve turns it on for P/D and peer pulls)."""
    replica_id: str = "replica-0"
    """Name used in logs, endpoints and metrics."""
    num_cpus_per_worker: float = 1.0
    """Ray CPUs per TP worker (TP > 1)."""
    placement_group: PlacementGroup | None = None
    """Placement group for the TP workers (one bundle per rank); None -> the executor makes one."""
    step_timeout_s: float = 120.0
    """A TP step (or collective) slower than this means a rank is broken: the replica restarts."""
    watchdog_interval_s: float = 1.0
    """How often the watchdog checks the engine and TP group."""

    def __post_init__(self) -> None:
        if self.step_timeout_s <= 0 or self.watchdog_interval_s <= 0:
            raise ValueError("step_timeout_s and watchdog_interval_s must be positive")


def default_host() -> str:
    """127.0.0.1 on a one-node (local) Ray cluster, this node's IP on a multi-node one."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return "127.0.0.1" if len(alive) <= 1 else ray.util.get_node_ip_address()


@contextlib.contextmanager
def gpu_load_lock(gpu_ids: list[str], lock_dir: str | None = None) -> Iterator[None]:
    """Hold one lock per GPU (this node's card ids) while a replica loads and sizes its KV cache.

    Replicas sharing a card (``replicas.gpus_per_replica`` < 1) then start one after another, so each
    reads the others' memory as in use at its start (kv_cache.outside_memory_in_use) instead of
    mistaking an allocation made meanwhile for its own. No GPU (CPU replicas, TP>1 actors): no lock."""
    import fcntl

    folder = lock_dir or tempfile.gettempdir()
    with contextlib.ExitStack() as stack:
        for gpu in sorted(gpu_ids):  # one order everywhere: no deadlock
            handle = stack.enter_context(open(os.path.join(folder, f"kvmesh-gpu-{gpu}.lock"), "a"))
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


class ReplicaActor:
    """Ray actor class (wrap with ``ray.remote`` or use ``start_replica_actor``)."""

    def __init__(self, options: ReplicaOptions):
        import ray
        from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas
        from kvmesh.replica.runtime import ReplicaRuntime

        cap_malloc_arenas()  # a worker on another node did not inherit serve's cap
        self.options = options
        ctx = ray.get_runtime_context()
        self.restarted = bool(ctx.was_current_actor_reconstructed)
        server = options.server
        if server.host == AUTO_HOST:
            server = replace(server, host=default_host())
        with gpu_load_lock([str(i) for i in ray.get_gpu_ids()]):  # cards shared with other replicas: one at a time
            self.runtime = ReplicaRuntime.start(
                options.engine, server, options.events, options.frontend, replica_id=options.replica_id,
                placement_group=options.placement_group,
                executor={"num_cpus_per_worker": options.num_cpus_per_worker, "step_timeout_s": options.step_timeout_s},
                kv_transfer=options.kv_transfer)
        self.started_at = time.time()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="replica-watchdog", daemon=True)
        self._watchdog.start()
        logger.info("replica %s ready (restarted=%s): %s", options.replica_id, self.restarted,
                    self.runtime.endpoints())

    def _watch(self) -> None:
        while not self._stop.wait(self.options.watchdog_interval_s):
            reason = self.runtime.broken_reason()
            if reason is not None:
                logger.error("replica %s is broken (%s); exiting so Ray restarts it", self.options.replica_id, reason)
                self.runtime.close_events()  # publish nothing stale
                os._exit(1)

    def ready(self) -> Endpoints:
        """Returns (the endpoints) once the replica serves; callers wait on it."""
        return self.endpoints()

    def endpoints(self) -> Endpoints:
        import ray

        info = self.runtime.endpoints()
        info.update(replica_id=self.options.replica_id, restarted=self.restarted, pid=os.getpid(),
                    node_id=ray.get_runtime_context().get_node_id(), started_at=self.started_at)
        return info

    def health(self) -> dict[str, bool | str | None]:
        reason = self.runtime.dead_reason()
        return {"healthy": reason is None, "reason": reason}

    def stats(self) -> dict[str, float | dict[str, int]]:
        return self.runtime.stats_dict()

    def load(self) -> dict[str, float | int | None]:
        return self.runtime.llm.load_report().to_dict()

    def shutdown(self, graceful_s: float = 10.0) -> bool:
        """Stop accepting, let in-flight requests finish for ``graceful_s`` (then abort), close everything."""
        self._stop.set()
        return self.runtime.shutdown(graceful_s)


def start_replica_actor(options: ReplicaOptions, name: str | None = None, max_restarts: int = 3,
                        namespace: str | None = None, **ray_options: RayOption) -> ActorHandle:
    """Create a ``ReplicaActor`` (not yet waited for: ``ray.get(actor.ready.remote())``).

    TP=1 on a GPU cluster needs the GPU in the actor itself (``num_gpus=1`` in ``ray_options``);
    with TP>1 the workers hold the GPUs and the actor needs none.
    """
    import ray

    opts: dict[str, RayOption] = {"num_cpus": 1, "max_restarts": max_restarts, "max_task_retries": 0,
                            "max_concurrency": 8}
    if name is not None:
        opts["name"] = name
    if namespace is not None:
        opts["namespace"] = namespace
    opts.update(ray_options)
    return ray.remote(ReplicaActor).options(**opts).remote(options)

