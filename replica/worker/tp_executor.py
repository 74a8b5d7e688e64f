"""The engine's side of tensor parallelism: ``RayTPExecutor`` drives one ``TPWorker`` actor per rank
(worker/tp_worker.py) step by step and looks like a ``ModelRunner`` to the engine.

    replica actor (LLMEngine: scheduler + block pool + events)
        │  RayTPExecutor.execute_model(SchedulerOutput)
        │  ray.put(out) once, then one Ray call per rank and step
        ▼
    TPWorker rank 0 ◀── all_reduce / all_gather (gloo | NCCL) ──▶ TPWorker rank 1 … N-1

Every rank computes the same sampled tokens (the logits are gathered before sampling); the executor returns
rank 0's. The ranks live in one placement group (one bundle per rank: a GPU each on a GPU cluster, CPUs
otherwise). A rank that fails or hangs past ``step_timeout_s`` marks the executor dead: every later step
raises at once and the owner takes the replica down.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.distributed.utils import DEFAULT_COLLECTIVE_TIMEOUT_S, DistributedInit
from kvmesh.replica.worker.tp_worker import RunnerFacts, TPWorker

if TYPE_CHECKING:
    from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
    from kvmesh.replica.step.scheduler_output import SchedulerOutput
    from ray.util.placement_group import PlacementGroup

logger = logging.getLogger(__name__)


class RayTPExecutor:
    """Drives ``tensor_parallel_size`` TPWorker actors; a ``ModelRunnerInterface`` for LLMEngine."""

    dead_reason: str | None = None
    """Why the TP group can no longer run steps (a rank died, raised or hung); None while it can."""
    num_host_blocks = 0
    """No host tier under tensor parallelism yet (EngineConfig refuses kv_offload_memory with TP > 1)."""
    kv_offload = None

    def finished_offload_stores(self) -> list[int]:
        return []

    def __init__(self, config: EngineConfig, placement_group: PlacementGroup | None = None,
                 num_cpus_per_worker: float = 1.0, init_timeout_s: float = 300.0,
                 step_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S):
        import ray
        from kvmesh.replica.distributed.utils import backend_for
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size = n = config.tensor_parallel_size
        self.step_timeout_s = step_timeout_s
        self.workers, self.placement_group, self._own_pg = [], None, False  # set first: ``shutdown`` reads them
        device = config.device or ("cuda" if _cuda_on_cluster() else "cpu")
        use_gpu = device == "cuda"
        # Each rank must not start its own TP group: the worker's config says device explicitly.
        config = replace(config, device=device)
        self._own_pg = placement_group is None
        if placement_group is None:
            bundle = {"GPU": 1, "CPU": num_cpus_per_worker} if use_gpu else {"CPU": num_cpus_per_worker}
            placement_group = make_pg([dict(bundle) for _ in range(n)], strategy="STRICT_PACK")
            try:
                ray.get(placement_group.ready(), timeout=init_timeout_s)
            except Exception as e:
                ray.util.remove_placement_group(placement_group)
                raise RuntimeError(f"no room for {n} TP ranks ({bundle} each) within {init_timeout_s}s: {e}. "
                                   "Free resources or lower tensor_parallel_size.") from e
        self.placement_group = placement_group
        worker_cls = ray.remote(TPWorker)
        self.workers = [
            worker_cls.options(
                num_cpus=num_cpus_per_worker if not use_gpu else 0, num_gpus=1 if use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=i),
                max_restarts=0, max_concurrency=4,  # a step, a ping, KV reads
            ).remote(config, i, n)
            for i in range(n)
        ]
        self.init_timeout_s = init_timeout_s
        try:
            addr, port = ray.get(self.workers[0].rendezvous.remote(), timeout=init_timeout_s)
            init = DistributedInit(addr, port, n, backend_for(device), step_timeout_s)
            infos = ray.get([w.init_model.remote(init) for w in self.workers], timeout=init_timeout_s)
        except Exception:
            self.shutdown()
            raise
        self._adopt(infos)

    def reload(self, config: EngineConfig) -> None:
        """Load another model (same TP size and device) into the running ranks; the caller builds a new engine."""
        import ray

        if config.tensor_parallel_size != self.world_size:
            raise ValueError(f"reload needs tensor_parallel_size={self.world_size}, got {config.tensor_parallel_size}")
        config = replace(config, device=self.device.split(":")[0])
        self._adopt(ray.get([w.load_model.remote(config) for w in self.workers], timeout=self.init_timeout_s))

    def _adopt(self, infos: list[RunnerFacts]) -> None:
        info = infos[0]
        self.num_kv_blocks = min(i.num_kv_blocks for i in infos)
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self.eos_token_ids = info.eos_token_ids
        self.device = info.device
        self.kv_layout = info.kv_layout  # rank 0's
        self.hf_config = None
        logger.info("TP group of %d ranks ready on %s (%d KV blocks)", self.world_size, self.device,
                    self.num_kv_blocks)

    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        import ray

        if self.dead_reason is not None:
            raise RuntimeError(f"tensor-parallel group is down: {self.dead_reason}")
        ref = ray.put(out)
        futures = [w.execute_model.remote(ref) for w in self.workers]
        try:
            results = ray.get(futures, timeout=self.step_timeout_s)
        except Exception as e:  # a rank died, raised or hung: the group is unusable from now on
            self.dead_reason = f"a rank failed a step: {type(e).__name__}: {e}"
            logger.error("tensor-parallel step failed; replica must restart: %s", self.dead_reason)
            for f in futures:
                try:
                    ray.cancel(f, force=False)
                except Exception:  # noqa: BLE001 - the rank may be gone already
                    pass
            raise RuntimeError(self.dead_reason) from e
        return results[0]

    def bind_thread(self) -> None:
        """Each rank steps on its own worker actor's thread, bound there; the driver's thread holds no device."""

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA:
        """Every rank reads the adapter (each keeps its shard in its slots); rank 0's bytes and identity (every
        rank reads the same whole files)."""
        import ray
        return ray.get([w.add_lora.remote(lora) for w in self.workers], timeout=self.step_timeout_s)[0]

    def remove_lora(self, lora: LoRARequest) -> bool:
        import ray
        return ray.get([w.remove_lora.remote(lora) for w in self.workers], timeout=self.step_timeout_s)[0]

    def lora_residency(self) -> tuple[list[str], float | None]:
        import ray  # rank 0's: every rank runs the same slot policy on the same steps
        try:
            return ray.get(self.workers[0].lora_residency.remote(), timeout=1.0)
        except Exception:  # noqa: BLE001 - a slow or gone rank: /load reports no residency rather than hang
            return [], None

    def lora_load_seconds(self) -> float:
        """0.0: the ranks' slot loads are not read per step (a call to rank 0 each step), so a TP step's time keeps
        them."""
        return 0.0

    def check_health(self, timeout_s: float = 10.0) -> str | None:
        """None when every rank answers, else why not (and the executor is marked dead)."""
        import ray

        if self.dead_reason is None:
            try:
                ray.get([w.ping.remote() for w in self.workers], timeout=timeout_s)
            except Exception as e:
                self.dead_reason = f"a rank does not answer: {type(e).__name__}: {e}"
                logger.error("tensor-parallel rank does not answer; replica must restart: %s", self.dead_reason)
        return self.dead_reason

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []
        if self._own_pg and self.placement_group is not None:
            try:
                ray.util.remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001
                pass
            self.placement_group = None


def _cuda_on_cluster() -> bool:
    import ray

    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
