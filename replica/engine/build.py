"""A serving engine with its model runner (``AsyncLLM.from_config``)."""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.llm_engine import LLMEngine

if TYPE_CHECKING:
    from typing import Unpack  # 3.11+; only read by type checkers

    from kvmesh.events.config import PublisherConfig
    from kvmesh.replica.executor.factory import ExecutorOptions
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
    from ray.util.placement_group import PlacementGroup


def build_engine(config: EngineConfig, hf_tokenizer: HFTokenizer | None = None,
                 model_runner: ModelRunnerInterface | None = None, events: PublisherConfig | None = None,
                 placement_group: PlacementGroup | None = None,
                 **executor_kwargs: Unpack[ExecutorOptions]) -> LLMEngine:
    """A serving engine and its model runner (a TP executor for tensor_parallel_size > 1; shut down if the engine
    cannot be built)."""
    if model_runner is None:
        from kvmesh.replica.executor.factory import make_model_runner

        model_runner = make_model_runner(config, placement_group, **executor_kwargs)
    try:
        engine = LLMEngine(config, model_runner=model_runner, tokenizer=hf_tokenizer, events=events)
    except BaseException:
        model_runner.shutdown()
        raise
    # Everything built so far (model, every KV block object, tokenizer) lives as long as the server:
    # move it out of the garbage collector's generations so full collections do not rescan it.
    gc.collect()
    gc.freeze()
    return engine
