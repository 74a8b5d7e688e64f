"""Several replicas on one GPU: what ``replicas.gpus_per_replica`` means for Ray and for each engine.

    gpus_per_replica = 0.5, engine.gpu_memory_utilization left at 0.9
    ┌──────────────────── one GPU ────────────────────┐
    │ replica-0: Ray GPU 0.5, memory 0.9 x 0.5 = 0.45 │
    │ replica-1: Ray GPU 0.5, memory 0.9 x 0.5 = 0.45 │
    └─────────────────────────────────────────────────┘

Ray's GPU resource only decides who may sit on a card; the memory each engine takes is its
``gpu_memory_utilization`` (vLLM's per-instance meaning: the share of the card THIS engine may use).
So on a shared card the two must agree:

- ``engine.gpu_memory_utilization`` at its default (0.9) means "0.9 of the card for all replicas on
  it": each replica gets 0.9 x gpus_per_replica.
- any other value is taken as each replica's own (as vLLM and Ray Serve users set it) and is refused
  when the replicas one card holds would together ask for more than the card.

Tensor parallelism needs whole GPUs: NCCL ranks each own a card.
"""

from __future__ import annotations

import dataclasses
import math

from kvmesh.replica.config import EngineConfig

RESOURCE_STEP = 1e-4
"""Ray counts resources in steps of 0.0001 (``ray._raylet.RESOURCE_UNIT_SCALING`` = 10000)."""
DEFAULT_MEMORY_UTILIZATION: float = next(f.default for f in dataclasses.fields(EngineConfig)
                                         if f.name == "gpu_memory_utilization")
"""EngineConfig's default, which serve scales to a replica's share of the card."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def gpus_per_worker(gpus_per_replica: float | None, tensor_parallel_size: int) -> float:
    """The Ray GPU amount of each tensor-parallel worker's bundle."""
    return 1.0 if gpus_per_replica is None else gpus_per_replica / tensor_parallel_size


def replicas_per_gpu(gpus_per_replica: float) -> int:
    """How many replicas of ``gpus_per_replica`` < 1 one card holds (Ray packs fractions on one card)."""
    return math.floor((1.0 + RESOURCE_STEP / 2) / gpus_per_replica)


def check_gpu_share(gpus_per_replica: float | None, tensor_parallel_size: int, gpu_memory_utilization: float) -> None:
    """ValueError (saying what to set) unless the GPU share and the engines' memory fit together."""
    if gpus_per_replica is None:
        return
    g, tp = gpus_per_replica, tensor_parallel_size
    _check(g > 0, f"replicas.gpus_per_replica={g} must be > 0 (e.g. 0.5 puts 2 replicas on one GPU)")
    _check(abs(g / RESOURCE_STEP - round(g / RESOURCE_STEP)) < 1e-6,
           f"replicas.gpus_per_replica={g}: Ray counts GPUs in steps of 0.0001; use e.g. {round(g, 4):g}")
    if tp > 1:
        _check(g == tp, f"replicas.gpus_per_replica={g:g} with engine.tensor_parallel_size={tp}: tensor parallelism "
                        f"needs a whole GPU per worker (each NCCL rank owns its card), so a replica takes {tp} GPUs; "
                        f"leave gpus_per_replica unset (or {tp}), or use tensor_parallel_size 1 to share GPUs")
        return
    _check(g <= 1, f"replicas.gpus_per_replica={g:g}: a replica without tensor parallelism runs on one GPU; use at "
                   f"most 1 (a fraction shares a card), or engine.tensor_parallel_size {math.ceil(g)} to use {g:g}")
    if g == 1 or gpu_memory_utilization == DEFAULT_MEMORY_UTILIZATION:
        return
    per_card = replicas_per_gpu(g)
    total = per_card * gpu_memory_utilization
    _check(total <= 1 + 1e-9,
           f"replicas.gpus_per_replica={g:g} puts {per_card} replicas on one GPU, and engine.gpu_memory_utilization="
           f"{gpu_memory_utilization:g} each adds up to {total:.2f} of the card; set at most "
           f"{math.floor(100 / per_card) / 100:g} each, or leave it at the default {DEFAULT_MEMORY_UTILIZATION:g}, "
           f"which serve scales to {DEFAULT_MEMORY_UTILIZATION:g} x {g:g} = "
           f"{replica_memory_utilization(g, DEFAULT_MEMORY_UTILIZATION):g} per replica")


def check_device_share(gpus_per_replica: float | None, device: str, why: str) -> None:
    """ValueError when GPUs are shared out (``gpus_per_replica`` set) but the replicas run on CPU (``why``: how
    that was decided): Ray would hand them no GPU, and the setting would do nothing without a word."""
    if gpus_per_replica is not None and device == "cpu":
        raise ValueError(f"replicas.gpus_per_replica={gpus_per_replica:g} shares out GPUs, but the replicas run on "
                         f"CPU ({why}); leave it unset on CPU, or run where there are GPUs")


def replica_memory_utilization(gpus_per_replica: float | None, gpu_memory_utilization: float) -> float:
    """The ``gpu_memory_utilization`` each replica's engine runs with (see the module doc)."""
    if gpus_per_replica is None or gpus_per_replica >= 1 or gpu_memory_utilization != DEFAULT_MEMORY_UTILIZATION:
        return gpu_memory_utilization
    return round(gpu_memory_utilization * gpus_per_replica, 4)
