"""The grammar compile process (engine/grammar_worker.py) is lean: it loads xgrammar's native compiler and none of
torch, numpy, transformers, pydantic or the replica's modules -- what a first constrained request waits for is a
process start, not seconds of imports. Read from the process's own memory map and its answers, not the clock; its
compiles equal those of xgrammar's Python classes, kind by kind."""

from __future__ import annotations

import json
import sys

import pytest
from kvmesh.replica.engine.grammar_process import start_worker
from kvmesh.replica.engine.grammar_text import compile_job
from kvmesh.replica.engine.grammar_worker import LeanCompiler, native_api
from kvmesh.replica.engine.xgrammar_backend import error_message, json_schema_grammar
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

xgr = pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

HEAVY_LIBRARIES = ("libtorch", "_multiarray_umath", "_pydantic_core", "tokenizers.abi3", "_C.cpython")
"""Native parts of torch, numpy, pydantic, Hugging Face tokenizers: mapped into a process once it imports them."""
LIMITED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
           "required": ["name", "n"], "additionalProperties": False}
CONSTRAINTS = [StructuredOutputsParams(json=json.dumps(LIMITED)), StructuredOutputsParams(json_object=True),
               StructuredOutputsParams(json=json.dumps(LIMITED), disable_any_whitespace=False),
               StructuredOutputsParams(regex=r"[a-z]{3}\d+"), StructuredOutputsParams(choice=("yes", "no")),
               StructuredOutputsParams(grammar='root ::= "a" root | "b"')]


@pytest.fixture(scope="module")
def info():
    """The stories260K tokenizer's info (the tokenizer alone: no model runs here)."""
    from transformers import PreTrainedTokenizerFast

    from ..conftest import STORIES_HF

    if not (STORIES_HF / "tokenizer.json").exists():
        pytest.skip(f"test model not found at {STORIES_HF} (needs ../shared beside the checkout)")
    hf = PreTrainedTokenizerFast.from_pretrained(str(STORIES_HF))
    return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=512, stop_token_ids=[2])


def reference(params: StructuredOutputsParams, info) -> str:
    """The compile through xgrammar's Python classes (what the lean compiler must equal)."""
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    kind, text, ws = compile_job(params, False)
    if kind == "json":
        return compiler.compile_grammar(json_schema_grammar(xgr, text, ws)).serialize_json()
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=ws).serialize_json()
    if kind == "regex":
        return compiler.compile_regex(text).serialize_json()
    return compiler.compile_grammar(text).serialize_json()


@pytest.mark.parametrize("params", CONSTRAINTS, ids=lambda p: f"{p.kind}-{p.disable_any_whitespace}")
def test_the_lean_compiler_compiles_as_xgrammars_python_classes_do(params, info):
    lean = LeanCompiler(native_api(), info.serialize_json(), 1 << 20)
    assert lean.compile(*compile_job(params, False)) == reference(params, info)


def test_a_constraint_that_does_not_parse_fails_with_xgrammars_message(info):
    lean = LeanCompiler(native_api(), info.serialize_json(), 1 << 20)
    with pytest.raises(Exception) as lean_error:
        lean.compile("regex", "(unclosed", False)
    with pytest.raises(Exception) as python_error:
        xgr.GrammarCompiler(info).compile_regex("(unclosed")
    assert error_message(lean_error.value) == error_message(python_error.value)
    assert "parenthesis" in error_message(lean_error.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's map in /proc")
def test_the_compile_process_loads_neither_torch_nor_numpy_nor_pydantic_nor_tokenizers(info):
    worker = start_worker(info.serialize_json(), 1 << 20)
    try:
        assert worker.conn.poll(60) and worker.conn.recv() == ("ready",)
        worker.conn.send((7, *compile_job(CONSTRAINTS[0], False)))
        assert worker.conn.poll(60)
        job_id, result, error, _ = worker.conn.recv()
        assert (job_id, error) == (7, None) and result == reference(CONSTRAINTS[0], info)
        with open(f"/proc/{worker.process.pid}/maps") as maps:
            mapped = maps.read()
        assert "libxgrammar_bindings" in mapped  # the map is read right: the compiler is there
        assert [lib for lib in HEAVY_LIBRARIES if lib in mapped] == []
        with open(f"/proc/{worker.process.pid}/cmdline") as cmdline:  # its own program, not a multiprocessing child
            assert cmdline.read().split("\0")[1:3] == ["-m", "kvmesh.replica.engine.grammar_worker"]
    finally:
        worker.kill()
