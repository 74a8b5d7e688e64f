"""Tensor parallelism over Ray: one worker actor per rank, driven step by step by the engine.

    replica actor (LLMEngine: scheduler + block pool + events)
        │  RayTPExecutor.execute_model(SchedulerOutput)  -- looks like a ModelRunner to the engine
        │  ray.put(out) once, then one Ray call per rank and step
        ▼
    TPWorker rank 0 ◀── all_reduce / all_gather (gloo | NCCL) ──▶ TPWorker rank 1 … N-1
      ModelRunner(config, rank=0, world_size=N)                    ModelRunner(config, rank=i, …)
      (its KV cache holds num_kv_heads / N heads: sharded by KV heads, same block ids on every rank)

Every rank computes the same sampled tokens (the logits are gathered before sampling); the
executor returns rank 0's. The ranks live in one placement group (one bundle per rank: a GPU each
on a GPU cluster, CPUs otherwise). A rank that fails or hangs past ``step_timeout_s`` marks the
executor dead: every later step raises at once and the owner takes the replica down.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.distributed.utils import DEFAULT_COLLECTIVE_TIMEOUT_S, DistributedInit

if TYPE_CHECKING:
    from kvmesh.replica.kv_layout import KVBlockLayout
    from kvmesh.replica.kv_transfer.agent import KVHandshake, KVTransferConfig
    from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
    from kvmesh.replica.step.scheduler_output import SchedulerOutput
    from kvmesh.replica.worker.model_runner import ModelRunner
    from ray.util.placement_group import PlacementGroup

logger = logging.getLogger(__name__)


class RunnerFacts(msgspec.Struct, frozen=True):
    """What a rank's ModelRunner tells the engine about itself (sent from each TPWorker to the executor)."""

    num_kv_blocks: int
    """KV cache blocks the rank holds (the executor takes the smallest)."""
    max_model_len: int
    """Longest sequence the model takes."""
    vocab_size: int
    """Token ids are in ``[0, vocab_size)``."""
    eos_token_ids: list[int]
    """Token ids that end a request."""
    device: str
    """Where the rank runs (``cuda:0``, ``cpu``)."""
    kv_layout: KVBlockLayout | None = None  # the rank's ModelRunner.kv_layout


class TPWorker:
    """One rank: its own process, its shard of the weights and of the KV cache."""

    def __init__(self, config: EngineConfig, rank: int, world_size: int):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.runner: ModelRunner | None = None
        self.kv_agent = None  # this rank's KV transfer agent, once the replica turns transfer on
        self.kv_aborts: dict = {}  # read id -> threading.Event set by kv_abort

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's node IP and a free port there (the group's meeting point)."""
        import ray
        from kvmesh.replica.distributed.utils import free_port

        ip = ray.util.get_node_ip_address()
        return ip, free_port()

    def init_model(self, init: DistributedInit) -> RunnerFacts:
        """Join the process group, build this rank's ModelRunner, report what the engine needs."""
        from kvmesh.replica.distributed.utils import init_distributed

        init_distributed(init, self.rank)
        return self.load_model(self.config)

    def load_model(self, config: EngineConfig) -> RunnerFacts:
        """(Re)build this rank's ModelRunner for ``config`` in the existing process group."""
        from kvmesh.replica.worker.model_runner import ModelRunner

        self.kv_close()  # its cache goes with the old runner
        self.config, self.runner = config, None
        self.runner = r = ModelRunner(config, rank=self.rank, world_size=self.world_size)
        return RunnerFacts(num_kv_blocks=r.num_kv_blocks, max_model_len=r.max_model_len, vocab_size=r.vocab_size,
                           eos_token_ids=list(r.eos_token_ids or ()), device=str(r.device), kv_layout=r.kv_layout)

    def execute_model(self, out: SchedulerOutput) -> dict[str, int] | None:
        sampled = self.runner.execute_model(out)
        return sampled if self.rank == 0 else None

    def ping(self) -> int:
        return self.rank

    def add_lora(self, lora: LoRARequest) -> LoadedLoRA: return self.runner.add_lora(lora)  # noqa: E704

    def remove_lora(self, lora_name: str) -> bool: return self.runner.remove_lora(lora_name)  # noqa: E704

    def lora_residency(self) -> tuple[list[str], float | None]: return self.runner.lora_residency()  # noqa: E704

    # -- KV transfer: this rank's own agent, its shard of the cache registered (kv_transfer/tp_agent.py) --
    def kv_agent_start(self, config: KVTransferConfig, name: str) -> KVHandshake:
        from kvmesh.replica.kv_transfer.agent import agent_for_runner

        self.kv_agent = agent_for_runner(config, name, self.runner)
        return self.kv_agent.handshake()

    def kv_add_peer(self, handshake: KVHandshake) -> str:
        return self.kv_agent.add_peer(handshake)

    def kv_remove_peer(self, peer: str) -> None:
        self.kv_agent.remove_peer(peer)

    def kv_read(self, peer: str, remote_block_ids: list[int], local_block_ids: list[int], remote_medium: str,
                read_id: str) -> None:
        """Read the peer rank's blocks into this rank's (beside the steps: the actor takes concurrent calls); returns
        or raises only once the read is over (``agent.wait``), aborted early by ``kv_abort(read_id)``."""
        import threading

        from kvmesh.replica.kv_transfer.agent import wait

        abort = self.kv_aborts[read_id] = threading.Event()
        try:
            transfer = self.kv_agent.start_read(peer, remote_block_ids, local_block_ids, remote_medium)
            wait(self.kv_agent, transfer, peer, abort=abort)
        finally:
            self.kv_aborts.pop(read_id, None)

    def kv_abort(self, read_id: str) -> None:
        """Give up on the read ``read_id`` (its ``kv_read`` answers once the transport let go); one not running
        (not started, or over) is left alone: it times out on its own."""
        abort = self.kv_aborts.get(read_id)
        if abort is not None:
            abort.set()

    def kv_close(self) -> None:
        if self.kv_agent is not None:
            self.kv_agent.close()
            self.kv_agent = None

    def shutdown(self) -> None:
        from kvmesh.replica.distributed.utils import destroy_distributed

        self.kv_close()
        self.runner = None
        destroy_distributed()


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

    def remove_lora(self, lora_name: str) -> bool:
        import ray
        return ray.get([w.remove_lora.remote(lora_name) for w in self.workers], timeout=self.step_timeout_s)[0]

    def lora_residency(self) -> tuple[list[str], float | None]:
        import ray  # rank 0's: every rank runs the same slot policy on the same steps
        try:
            return ray.get(self.workers[0].lora_residency.remote(), timeout=1.0)
        except Exception:  # noqa: BLE001 - a slow or gone rank: /load reports no residency rather than hang
            return [], None

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
