"""Structured outputs in the engine (engine/structured_output.py): every answer matches its constraint, on every
path (sync, async scheduling, preemption, chunked prefill), with the mask applied where the sampler runs."""

from __future__ import annotations

import json
import random
import string

import pytest
import torch
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.serving.sampling_params import SamplingParams, SamplingParamsError
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

from ..grammar_processes import compile_workers, wait_for
from .test_engine_async_scheduling import PROMPTS, both, engine, generate

xgr = pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

SCHEMA = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "angry"]}, "ok": {"type": "boolean"}},
          "required": ["mood", "ok"], "additionalProperties": False}


def matches_schema(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"mood", "ok"} and value["mood"] in ("happy", "sad", "angry") and isinstance(value["ok"], bool)


def constrained(max_tokens: int = 64) -> dict[str, SamplingParams]:
    """A JSON schema, a choice, a regex and an unconstrained request, seeded where random."""
    return {"a": SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                structured_outputs=StructuredOutputsParams.from_schema(SCHEMA, "x")),
            "b": SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens,
                                structured_outputs=StructuredOutputsParams(choice=("yes", "no"))),
            "c": SamplingParams(temperature=1.0, seed=5, max_tokens=max_tokens,
                                structured_outputs=StructuredOutputsParams(regex=r"[a-z]+ [0-9]{3}")),
            "d": SamplingParams(temperature=0.8, seed=2, max_tokens=28, ignore_eos=True)}


def check_answers(results: dict[str, tuple]) -> None:
    assert matches_schema(results["a"][2]) and results["a"][1] == "stop"
    assert results["b"][2] in ("yes", "no") and results["b"][1] == "stop"
    assert results["c"][1] == "stop"
    word, number = results["c"][2].split(" ")
    assert word.isalpha() and word.islower() and number.isdigit() and len(number) == 3
    assert len(results["d"][0]) == 28


@pytest.mark.parametrize("ours", ["apply_grammar_bitmask", "apply_grammar_bitmask_torch"])
def test_grammar_mask_matches_xgrammars_reference(ours):
    """The mask as the sampler applies it (xgrammar's CPU kernel on the constrained rows) and the plain torch
    unpacking (other devices) against xgrammar's torch reference on every row, on a vocabulary that is not a multiple
    of 32 and a subset of rows."""
    from kvmesh.replica.sample import grammar_mask

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 100, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), generator=gen, dtype=torch.int64).to(torch.int32)
    masked, theirs = logits.clone(), logits.clone()
    full = torch.full((5, 4), -1, dtype=torch.int32)
    full[[4, 0, 2]] = bitmask
    full[1] = 0  # an unconstrained row's bitmask row is never read
    getattr(grammar_mask, ours)(masked, [4, 0, 2], full)
    full[1] = -1
    xgr.apply_token_bitmask_inplace(theirs, full, vocab_size=100, backend="torch_native")
    assert torch.equal(masked, theirs)
    assert torch.isinf(masked).any() and torch.equal(masked[[1, 3]], logits[[1, 3]])


def test_every_answer_matches_its_constraint_sync_and_async(stories_path):
    sync, async_, _ = both(stories_path, constrained())
    check_answers(sync)
    assert async_ == sync  # the in-flight token is waited for: the same tokens


def generate_compiled(eng, params: dict[str, SamplingParams]) -> dict[str, tuple]:
    """``generate``, its first step taken once every grammar has compiled: the requests then run together and a
    small cache runs short, however fast the pool compiles (on a loaded machine they could start one by one)."""
    for rid, sp in params.items():
        eng.add_request(EngineRequest(rid, PROMPTS[rid], sp))
    assert wait_for(lambda: all(g.future.done() for g in eng.structured_output.live.values()), 60)
    return generate(eng, {})

def test_preemption_and_chunked_prefill_keep_the_matcher_in_step(stories_path):
    """Preempted requests are recomputed from their tokens (the matcher stays where it was); long prompts arrive in
    8-token chunks, only the last of which samples: the answers are those of a roomy run."""
    roomy = generate(engine(stories_path, False), constrained(40))
    small = {"num_kv_blocks": 17, "max_num_batched_tokens": 8}
    sync = generate_compiled(engine(stories_path, False, **small), constrained(40))
    eng = engine(stories_path, True, **small)
    async_ = generate_compiled(eng, constrained(40))
    assert sync == async_ == roomy
    assert eng.get_stats().num_preemptions > 0
    check_answers(roomy)


def test_json_at_temperature_one_parses_for_every_seed(stories_path):
    params = {rid: SamplingParams(temperature=1.0, seed=seed, max_tokens=64,
                                  structured_outputs=StructuredOutputsParams.from_schema(SCHEMA, "x"))
              for rid, seed in zip("abcd", range(4), strict=True)}
    for _, reason, text in generate(engine(stories_path, False), params).values():
        assert reason == "stop" and matches_schema(text), text


LIMITED = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                          "tags": {"type": "array", "items": {"type": "string", "minLength": 2}}},
           "required": ["city", "tags"], "additionalProperties": False}
"""Strings with a length bound: xgrammar writes another character class for them."""


@pytest.mark.parametrize("character", ["\x0c", "\x1f", "\x00", "\t"])
def test_a_length_limited_string_takes_no_control_character(character):
    """JSON forbids control characters in a string unescaped; xgrammar 0.2 lets them into a length-limited one (the
    random-weights model wrote a form feed into a tool call's city, and the answer did not parse)."""
    from kvmesh.replica.engine.xgrammar_backend import json_schema_grammar

    accepts = xgr.testing._is_grammar_accept_string
    grammar = json_schema_grammar(xgr, json.dumps(LIMITED), any_whitespace=False)
    assert accepts(grammar, '{"city": "Paris", "tags": ["ab", "c\u00e9d"]}')
    assert not accepts(grammar, f'{{"city": "Pa{character}ris", "tags": []}}')
    assert not accepts(grammar, f'{{"city": "Paris", "tags": ["a{character}b"]}}')


def test_length_limited_strings_parse_for_every_seed(stories_path):
    for seeds in (range(4), range(4, 8)):
        params = {rid: SamplingParams(temperature=1.5, seed=seed, max_tokens=96,
                                      structured_outputs=StructuredOutputsParams.from_schema(LIMITED, "x"))
                  for rid, seed in zip("abcd", seeds, strict=True)}
        for _, reason, text in generate(engine(stories_path, False), params).values():
            if reason == "stop":
                assert set(json.loads(text)) == {"city", "tags"}, text


def test_max_tokens_inside_the_grammar_ends_with_length(stories_path):
    params = {"a": SamplingParams(temperature=0.0, max_tokens=3,
                                  structured_outputs=StructuredOutputsParams.from_schema(SCHEMA, "x"))}
    tokens, reason, text = generate(engine(stories_path, False), params)["a"]
    assert reason == "length" and len(tokens) == 3 and text.startswith("{")


def test_a_complete_grammar_stops_even_with_ignore_eos(stories_path):
    params = {"b": SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                                  structured_outputs=StructuredOutputsParams(choice=("yes", "no")))}
    _, reason, text = generate(engine(stories_path, False), params)["b"]
    assert reason == "stop" and text in ("yes", "no")


@pytest.mark.parametrize("so, field", [
    (StructuredOutputsParams(regex="(ab", field="guided_regex"), "guided_regex"),
    (StructuredOutputsParams(grammar='root ::= "a" |', field="structured_outputs"), "structured_outputs"),
    (StructuredOutputsParams(json='{"type": 5}', field="response_format.json_schema.schema"),
     "response_format.json_schema.schema"),
])
def test_a_constraint_that_does_not_compile_is_refused_naming_its_field(stories_path, so, field):
    eng = engine(stories_path, False)
    with pytest.raises(SamplingParamsError) as err:
        eng.add_request(EngineRequest("x", PROMPTS["a"], SamplingParams(max_tokens=4, structured_outputs=so)))
    assert err.value.param == field and field in str(err.value)
    assert not eng.has_unfinished_requests()


def slow_choice(seed: int, words: int = 1000) -> StructuredOutputsParams:
    """A choice list (unique per ``seed``); 1,000 words take about a second to compile on stories260K's tokenizer."""
    rng = random.Random(seed)
    choice = tuple("".join(rng.choice(string.ascii_lowercase) for _ in range(60)) for _ in range(words))
    return StructuredOutputsParams(choice=choice,
              field="guided_choice")


def test_grammars_compile_off_the_engine_thread_and_the_others_run_meanwhile(stories_path):
    """A slow compile holds only its own request back (it waits in the scheduler, compiled in another process); a
    second request with the same spec shares the compilation."""
    eng = engine(stories_path, False)
    manager, so = eng.structured_output, slow_choice(0, words=100)
    eng.add_request(EngineRequest("c1", PROMPTS["a"],
                                  SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=so)))
    eng.add_request(EngineRequest("c2", PROMPTS["b"],
                                  SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=so)))
    eng.add_request(EngineRequest("free", PROMPTS["d"], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)))
    done = {}
    while "free" not in done:
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert eng.scheduler.requests["c1"].num_computed_tokens == 0  # still waiting for its grammar
    assert len(manager._cache) == 1
    while eng.has_unfinished_requests():
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert {done[r].finish_reason for r in ("c1", "c2")} == {"stop"}, done["c1"].error
    assert done["c1"].text in so.choice and manager.pool.stats["compiled"] == 1  # one compile for both
    eng.close()


def test_a_token_the_grammar_refuses_fails_only_its_request(stories_path, monkeypatch):
    """Hostile: a sampler that ignores the mask. The matcher refuses the token; that request ends with an error,
    the unconstrained one is served."""
    import kvmesh.replica.sample.sampler as sampler

    monkeypatch.setattr(sampler, "apply_grammar_bitmask", lambda logits, rows, bitmask: None)
    params = {"b": SamplingParams(temperature=0.0, max_tokens=8,
                                  structured_outputs=StructuredOutputsParams(choice=("zzzz", "qqqq"))),
              "d": SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)}
    results = generate(engine(stories_path, False), params)
    assert results["b"][1] == "error" and len(results["d"][0]) == 6


def test_the_masked_sampler_runs_on_the_meta_device():
    """The runner's part of a constrained step (its rows leave the fixed sampler, the bitmask goes to the logits'
    device and masks them) makes every tensor on the device of the logits."""
    from kvmesh.replica.sample.grammar_mask import grammar_rows
    from kvmesh.replica.sample.sampler import Sampler
    from kvmesh.replica.step.scheduler_output import GrammarBitmask, ScheduledRequest, SchedulerOutput
    from kvmesh.replica.worker.input_batch import InputBatch

    meta = torch.device("meta")
    batch = InputBatch(4, 8, 16, meta)
    so = SamplingParams(temperature=0.0, structured_outputs=StructuredOutputsParams(choice=("a", "b")))
    free = SamplingParams(temperature=0.0)
    inputs = batch.prepare(SchedulerOutput([ScheduledRequest("free", [1, 2, 3], 0, [1], True, free),
                                            ScheduledRequest("so", [4, 5], 0, [2], True, so)], 5))
    assert batch._graph_sampling(inputs.sample_rows)[1] is False  # the graph's sampler does not answer
    md = batch.sampling_metadata(inputs.sample_rows, 64, [2])
    bitmask = GrammarBitmask(["so"], torch.full((1, 2), 5, dtype=torch.int32).numpy())  # tokens 0, 2, 32, 34
    md.grammar = grammar_rows(bitmask, inputs.sample_request_ids, meta)
    assert md.grammar[1].device == meta
    tokens = Sampler()(torch.zeros(2, 64, device=meta), md)
    assert tokens.device == meta and tokens.shape == (2,)


def test_a_continuation_resumes_the_constraint_after_the_tokens_already_sent(stories_path):
    """A migrated stream's continuation (router/http/migration.py): prompt + output so far, the constraint resumed
    after them, gives the rest of the uninterrupted answer; resumed tokens the constraint refuses fail the request."""
    from dataclasses import replace

    so = StructuredOutputsParams.from_schema(SCHEMA, "x")
    whole = generate(engine(stories_path, False), {"a": SamplingParams(temperature=0.0, max_tokens=64,
                                                                     structured_outputs=so)})["a"][0]
    eng, sent = engine(stories_path, False), 7
    eng.add_request(EngineRequest("a", PROMPTS["a"] + whole[:sent], SamplingParams(
        temperature=0.0, max_tokens=64 - sent, structured_outputs=replace(so, num_resumed_tokens=sent))))
    done = {}
    while eng.has_unfinished_requests():
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert done["a"].output_token_ids == whole[sent:] and done["a"].finish_reason == "stop"
    eng.add_request(EngineRequest("b", PROMPTS["a"] + whole[1:sent], SamplingParams(  # the '{' left out: refused
        temperature=0.0, max_tokens=8, structured_outputs=replace(so, num_resumed_tokens=sent - 1))))
    while eng.has_unfinished_requests():
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert done["b"].finish_reason == "error" and "num_resumed_tokens" in done["b"].error
    with pytest.raises(SamplingParamsError) as err:
        eng.add_request(EngineRequest("c", PROMPTS["d"],
                                      SamplingParams(structured_outputs=replace(so, num_resumed_tokens=4))))
    assert err.value.param == "x.num_resumed_tokens"


@pytest.mark.gpu
def test_constraints_hold_on_cuda_with_graphs_and_async_scheduling(stories_path):
    """On CUDA (decode graphs captured, async scheduling the default): constrained rows leave the graphs' sampler for
    the eager one, xgrammar's CUDA kernel masks them, and async gives the tokens of sync."""
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.llm_engine import LLMEngine

    def run(async_scheduling):
        eng = LLMEngine(EngineConfig(model=str(stories_path), dtype="float32", device="cuda", block_size=16,
                                     gpu_memory_utilization=0.05, async_scheduling=async_scheduling))
        return eng, generate(eng, constrained())

    eng, async_ = run(None)
    assert eng.async_scheduling and eng.model_runner.static_decode is not None
    _, sync = run(False)
    check_answers(sync)
    assert async_ == sync


def test_a_compile_that_overruns_fails_its_request_and_later_ones_compile(stories_path):
    """Hostile: a grammar whose compile outlasts compile_timeout_s. Its request fails with an error naming the
    field, its compile process is killed and replaced (the pool keeps compile_processes of them), and a later
    request compiles."""
    from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig

    eng = engine(stories_path, False, structured_outputs=StructuredOutputsConfig(compile_processes=1,
                                                                                 compile_timeout_s=0.2))
    eng.add_request(EngineRequest("stuck", PROMPTS["a"],
                                  SamplingParams(max_tokens=8, structured_outputs=slow_choice(1))))
    done = {}
    while eng.has_unfinished_requests():
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert done["stuck"].finish_reason == "error" and "guided_choice" in done["stuck"].error
    assert "did not compile within 0.2 s" in done["stuck"].error
    eng.add_request(EngineRequest("next", PROMPTS["a"], SamplingParams(temperature=0.0, max_tokens=8,
                                                         structured_outputs=StructuredOutputsParams(choice=("yes",
                                                                                                            "no")))))
    while eng.has_unfinished_requests():
        done |= {o.request_id: o for o in eng.step() if o.finished}
    assert done["next"].finish_reason == "stop"
    stats = eng.structured_output.pool.stats
    assert (stats["timed_out"], stats["compiled"], stats["running"], stats["waiting"]) == (1, 1, 0, 0)
    pids = eng.structured_output.pool.worker_pids
    assert len(pids) == 1 and {w.pid for w in compile_workers()} >= set(pids)
    eng.close()
    assert wait_for(lambda: not {w.pid for w in compile_workers()} & set(pids), 5)


def test_a_constraint_checked_once_is_not_parsed_again(monkeypatch):
    """The replica's HTTP layer checks constraints on a worker thread (engine/structured_output.py:
    check_constraints); the engine thread then finds them checked instead of parsing a large schema again."""
    from kvmesh.replica.engine.structured_output import check_constraints

    parsed = []
    from_regex = xgr.Grammar.from_regex
    monkeypatch.setattr(xgr.Grammar, "from_regex", lambda regex, *a, **k: parsed.append(regex) or from_regex(regex))
    so = StructuredOutputsParams(regex="[0-9]{4}-checked-once")
    check_constraints([so])
    check_constraints([so, StructuredOutputsParams(regex="[0-9]{4}-checked-once", field="guided_regex")])
    assert parsed == ["[0-9]{4}-checked-once"]
    with pytest.raises(SamplingParamsError):
        check_constraints([StructuredOutputsParams(regex="([0-9]", field="guided_regex")])


def test_aborted_and_finished_requests_leave_no_grammar_behind(stories_path):
    eng = engine(stories_path, True)
    results = generate(eng, constrained(), abort_after={"a": 3})
    assert results["a"][1] == "abort" and results["b"][1] == "stop"
    assert eng.structured_output.live == {} and not eng.structured_output._compiling
