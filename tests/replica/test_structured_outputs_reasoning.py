"""A constraint that waits for the reasoning to end (``StructuredOutputsParams.reasoning_end``, set by a chat's
reasoning parser): the output is free until it writes the end text, constrained from the next token on, on the sync
and the async engine alike. stories260K writes no ``</think>``, so a word it writes soon stands in for it."""

from __future__ import annotations

import pytest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

from .test_engine_async_scheduling import both

pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (the engine extra)")

END = " play"
"""Written by the greedy answers to prompts a, c and d within their first 40 tokens (and not by b's)."""


def test_the_constraint_applies_after_the_reasoning_and_not_before(stories_path):
    free = {rid: SamplingParams(temperature=0.0, max_tokens=40) for rid in "acd"}
    waiting = {rid: SamplingParams(temperature=0.0, max_tokens=40,
                                   structured_outputs=StructuredOutputsParams(choice=("yes", "no"),
                                                                              reasoning_end=END)) for rid in "acd"}
    free_sync, _, _ = both(stories_path, free)
    sync, async_, _ = both(stories_path, waiting)
    assert sync == async_
    for rid, (_, reason, text) in sync.items():
        cut = text.index(END) + len(END)
        reasoning, answer = text[:cut], text[cut:]
        assert free_sync[rid][2].startswith(reasoning), rid  # the reasoning was not masked
        assert answer in ("yes", "no") and reason == "stop", (rid, text)


def test_an_answer_that_never_ends_its_reasoning_is_never_constrained(stories_path):
    sync, async_, _ = both(stories_path,
                           {"b": SamplingParams(temperature=0.0, max_tokens=30,
                                                structured_outputs=StructuredOutputsParams(
        regex="[0-9]+", reasoning_end=END))})
    free, _, _ = both(stories_path, {"b": SamplingParams(temperature=0.0, max_tokens=30)})
    assert sync == async_ == free
    assert END not in free["b"][2]


def test_a_constraint_without_reasoning_end_applies_from_the_first_token(stories_path):
    sync, _, _ = both(stories_path, {"a": SamplingParams(temperature=0.0, max_tokens=40,
                                                         structured_outputs=StructuredOutputsParams(choice=("yes",
                                                                                                            "no")))})
    assert sync["a"][2] in ("yes", "no")
