"""Tensor parallelism over Ray, the rank's side: ``TPWorker``, one Ray actor per rank, holds that rank's
``ModelRunner(config, rank=i, world_size=N)`` (its KV cache holds num_kv_heads / N heads: sharded by KV heads,
the same block ids on every rank) and joins the group's collectives (gloo | NCCL); ``RayTPExecutor``
(worker/tp_executor.py) drives the ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.distributed.utils import DistributedInit

if TYPE_CHECKING:
    from kvmesh.replica.kv_layout import KVBlockLayout
    from kvmesh.replica.kv_transfer.agent import KVHandshake, KVTransferConfig
    from kvmesh.replica.serving.lora_request import LoadedLoRA, LoRARequest
    from kvmesh.replica.step.scheduler_output import SchedulerOutput
    from kvmesh.replica.worker.model_runner import ModelRunner


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

    def remove_lora(self, lora: LoRARequest) -> bool: return self.runner.remove_lora(lora)  # noqa: E704

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
