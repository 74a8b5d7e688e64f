"""A replica server starts its grammar compile processes at start-up (``structured_outputs.warm_start``), in the
background: the first constrained request finds them running and starts none; off, none run before one is asked.
Counted by the pool's process ids, not by the clock."""

from __future__ import annotations

import time

import httpx
import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.runtime import ReplicaRuntime
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig

from ..conftest import CHAT_TEMPLATE

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

KEY = "warm-start-key-0"


def start(stories_path, warm: bool) -> ReplicaRuntime:
    from kvmesh.replica.openai.config import FrontendConfig

    config = EngineConfig(model=str(stories_path), kv_cache_memory=4 << 20,
                          structured_outputs=StructuredOutputsConfig(warm_start=warm))
    return ReplicaRuntime.start(config, ReplicaServerConfig(port=0, event_port=None, api_key=KEY,
                                                            served_model_name="s"),
                                frontend=FrontendConfig(chat_template=CHAT_TEMPLATE))


def compile_pids(runtime: ReplicaRuntime, wait_s: float = 120.0) -> tuple[int, ...]:
    """The compile processes once both run (empty when none starts within ``wait_s``)."""
    manager = runtime.llm.engine.structured_output
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        pool = manager.pool
        if pool is not None and len(pool.worker_pids) == pool.config.compile_processes:
            return pool.worker_pids
        time.sleep(0.1)
    return ()


def constrained(runtime: ReplicaRuntime) -> httpx.Response:
    return httpx.post(runtime.http.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      timeout=120, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                         "response_format": {"type": "json_object"}})


def test_the_compile_processes_start_with_the_server_and_serve_the_first_constrained_request(stories_path):
    runtime = start(stories_path, True)
    try:
        warmed = compile_pids(runtime)
        assert len(warmed) == 2
        assert constrained(runtime).status_code == 200
        assert runtime.llm.engine.structured_output.pool.worker_pids == warmed  # none started for it
        assert runtime.llm.engine.structured_output.pool.stats["compiled"] == 1
    finally:
        runtime.shutdown(graceful_s=1)


def test_without_warm_start_no_compile_process_runs_before_a_constrained_request(stories_path):
    runtime = start(stories_path, False)
    try:
        time.sleep(1.0)
        assert runtime.llm.engine.structured_output.pool is None
        assert constrained(runtime).status_code == 200
        assert runtime.llm.engine.structured_output.pool is not None
    finally:
        runtime.shutdown(graceful_s=1)


def test_a_manager_closed_before_its_warm_up_starts_no_process(stories_path):
    from kvmesh.replica.engine.structured_output import StructuredOutputManager
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    manager = StructuredOutputManager(load_tokenizer(stories_path).hf, 512, frozenset({2}))
    manager.close()
    manager.warm()
    assert manager.pool is None
