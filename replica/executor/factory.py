"""The model runner the engine drives: a ``ModelRunner`` in this process, a ``RayTPExecutor`` over TP ranks.

    LLMEngine / AsyncLLM.from_config ──make_model_runner──▶ worker/model_runner.py | worker/tp_executor.py
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing import Unpack  # 3.11+; only read by type checkers

    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.spec_decode.config import SpeculativeConfig
    from kvmesh.replica.worker.draft_model import DraftModel
    from ray.util.placement_group import PlacementGroup


class ExecutorOptions(TypedDict, total=False):
    """``RayTPExecutor``'s keyword arguments besides the config, as callers pass them through."""

    num_cpus_per_worker: float
    """CPUs each rank's actor reserves."""
    init_timeout_s: float
    """Longest wait for the placement group and the ranks' model load."""
    step_timeout_s: float
    """Longest a step (or a collective) may take before the group is declared dead."""


def local_model_runner(config: EngineConfig) -> ModelRunnerInterface:
    """A ModelRunner in this process (what ``LLMEngine`` builds when given no runner); with ``emulation`` an
    ``EmulatedModelRunner`` (no model: steps wait out a timing profile)."""
    if config.emulation.enabled:
        from kvmesh.replica.emulate.runner import EmulatedModelRunner

        return EmulatedModelRunner(config.emulation, config.model, config.block_size, config.resolved_kv_cache_memory,
                                   config.kv_offload_memory, config.max_model_len, config.hf_config)
    from kvmesh.replica.worker.model_runner import ModelRunner

    return ModelRunner(config)


def local_draft_model(config: EngineConfig, spec: SpeculativeConfig, vocab_size: int, max_model_len: int,
                      num_kv_blocks: int) -> DraftModel:
    """The draft model of ``spec`` (the config's ``speculative_config``, method "draft_model") in this process, its
    KV cache as many blocks as the target's, at most ``max_num_seqs`` whole contexts (worker/draft_model.py)."""
    from kvmesh.replica.worker.draft_model import DraftModel

    bs = config.block_size
    num_blocks = min(num_kv_blocks, config.max_num_seqs * (-(-max_model_len // bs) + 1)) + 1
    return DraftModel(spec.model, config, vocab_size, max_model_len, num_blocks)


def make_model_runner(config: EngineConfig, placement_group: PlacementGroup | None = None,
                      **executor_kwargs: Unpack[ExecutorOptions]) -> ModelRunnerInterface:
    """A ModelRunner in this process for TP=1 (or an emulated one), a RayTPExecutor for TP>1."""
    if config.tensor_parallel_size == 1:
        return local_model_runner(config)
    from kvmesh.replica.worker.tp_executor import RayTPExecutor

    return RayTPExecutor(config, placement_group=placement_group, **executor_kwargs)
