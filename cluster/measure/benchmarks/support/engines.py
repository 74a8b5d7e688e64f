"""The engines the engine benchmarks drive: float32, no tokenizer, real or dummy weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.replica.engine.llm_engine import LLMEngine


def make_engine(model_dir: str | None, hf_config: dict | None = None, **kw) -> LLMEngine:
    """A float32 engine without a tokenizer: on ``model_dir``, or dummy weights of ``hf_config``'s shape."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    kw.setdefault("kv_cache_memory", 1 << 30)
    if model_dir is None:
        cfg = EngineConfig(model="dummy", load_format="dummy", hf_config=hf_config, dtype="float32", **kw)
    else:
        cfg = EngineConfig(model=model_dir, dtype="float32", **kw)
    return LLMEngine(cfg, skip_tokenizer_init=True)
