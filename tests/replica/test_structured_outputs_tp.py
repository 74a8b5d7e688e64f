"""Structured outputs with tensor parallelism on CPU (gloo, one Ray worker per rank): the step's bitmask travels with
the SchedulerOutput to every rank, and TP=2 gives TP=1's constrained answers."""

from __future__ import annotations

import pytest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.worker.tp_executor import RayTPExecutor

from .test_engine_async_scheduling import generate
from .test_structured_outputs_engine import check_answers, constrained
from .test_tp_equivalence import engine_config

pytestmark = pytest.mark.ray
pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")


def test_tp2_gives_tp1s_constrained_answers(ray_session, stories_path):
    tp1 = generate(LLMEngine(engine_config(stories_path, 1)), constrained())
    executor = RayTPExecutor(engine_config(stories_path, 2), step_timeout_s=60)
    try:
        tp2 = generate(LLMEngine(engine_config(stories_path, 2), model_runner=executor), constrained())
    finally:
        executor.shutdown()
    check_answers(tp1)
    assert tp2 == tp1
