"""``/load``'s ``num_grammar_compiles``: the requests whose grammar compiles now, within the compile timeout (one
past it is no sign of work: the engine fails it on its next step, and a stuck engine must not look busy)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from kvmesh.replica.engine.structured_output import (
    StructuredOutputManager,
    StructuredOutputRequest,
    StructuredOutputsConfig,
)
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams


def _compiling(manager: StructuredOutputManager, request_id: str, started_s_ago: float) -> None:
    grammar = StructuredOutputRequest(StructuredOutputsParams(regex="[0-9]+"), Future(), [])
    grammar.since = time.monotonic() - started_s_ago
    manager.live[request_id] = grammar
    manager._compiling.add(request_id)


def test_only_compiles_within_their_timeout_count():
    manager = StructuredOutputManager(None, 512, frozenset({2}), StructuredOutputsConfig(compile_timeout_s=10.0))
    assert manager.compiling() == []
    _compiling(manager, "fresh", 1.0)
    _compiling(manager, "overran", 11.0)
    assert manager.compiling() == ["fresh"]
    manager.finish("fresh")
    assert manager.compiling() == []
