"""qwen3 ends the reasoning at a tool call opened inside the thinking (``<tool_call>`` then ``<function``): a
constraint that waits for the reasoning starts there too (the engine reads the parser's rule, not ``</think>``
alone), the answer is read by the same rule, and a stream reads an opener followed by any amount of whitespace in
work linear in the text."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from kvmesh.replica.openai.reasoning_parsers import ReasoningStream, reasoning_parser, split
from kvmesh.replica.openai.reasoning_parsers.stream import split as split_text
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams

from .test_reasoning_parsers import streamed

pytest.importorskip("xgrammar", reason="the engine's structured outputs need xgrammar")

from kvmesh.replica.engine.structured_output import StructuredOutputRequest  # noqa: E402
from kvmesh.replica.openai.reasoning_fields import wait_for_reasoning  # noqa: E402

PIECES = ["I", " need", " the", " weather", ".\n", "<tool_call>", "\n", "<function", "=", "get", "_weather"]
"""A Qwen3.5 answer calling from inside its thinking, one token per piece."""


def reasoning_tokens(params: StructuredOutputsParams, pieces: list[str]) -> int | None:
    """How many of ``pieces`` (token texts) the engine reads as reasoning before the constraint applies (None:
    the reasoning never ended)."""
    grammar = StructuredOutputRequest(params, Future(), [])
    for i, _ in enumerate(pieces):
        grammar.reason(i, lambda ids: "".join(pieces[t] for t in ids))
        if grammar.reasoning_ids is None:
            return i + 1
    return None


def waiting(parser: str) -> StructuredOutputsParams:
    """The constraint of a forced call on a server with ``--reasoning-parser parser``, as the chat server sets it."""
    sp = SamplingParams(structured_outputs=StructuredOutputsParams(json='{"type": "object"}'))
    wait_for_reasoning(reasoning_parser(parser, constrained=True), [sp])
    return sp.structured_outputs


def test_a_constraint_starts_where_qwen3_ends_the_reasoning_at_a_call_inside_the_thinking():
    assert reasoning_tokens(waiting("qwen3"), PIECES) == PIECES.index("=") + 1


def test_a_tool_call_tag_without_a_function_leaves_the_constraint_waiting():
    pieces = ["maybe", " <tool_call>", " later", " then", " more", " text"]
    assert reasoning_tokens(waiting("qwen3"), pieces) is None
    assert reasoning_tokens(waiting("qwen3"), [*pieces, "</think>", "{"]) == len(pieces) + 1


def test_deepseek_r1_constraints_wait_for_the_end_tag_only():
    assert reasoning_tokens(waiting("deepseek_r1"), PIECES) is None


def test_a_constrained_answer_is_read_by_the_engines_rule():
    """The opener that ended the reasoning is not the constraint's output: the content is what came after it."""
    text = "I need the weather.\n<tool_call>\n<function={\"city\": \"Paris\"}"
    assert split(reasoning_parser("qwen3", constrained=True), text) == ("I need the weather.\n", '{"city": "Paris"}')
    assert split(reasoning_parser("qwen3"), text)[1].startswith("<tool_call>")  # unconstrained: vLLM's content
    parser = reasoning_parser("qwen3", constrained=True)
    for cut in range(len(text) + 1):
        stream = ReasoningStream(parser)
        first, last = stream.feed(text[:cut]), stream.feed(text[cut:], final=True)
        assert (first[0] + last[0], first[1] + last[1]) == ("I need the weather.\n", '{"city": "Paris"}'), cut


class CountingParser:
    """A parser that counts the characters handed to ``find_end`` (the work of reading a stream)."""

    def __init__(self, name: str) -> None:
        self.inner, self.read = reasoning_parser(name), 0

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def find_end(self, text, start, final):
        self.read += len(text) - start
        return self.inner.find_end(text, start, final)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("tail", ["", "<function=f>", "x</think>ok"])
def test_an_opener_followed_by_whitespace_streams_in_linear_work(name, tail):
    """One-space deltas after ``<tool_call>``: the characters the parser reads grow with the text, not its
    square (n = 4000 and 8000: the work at most doubles; a tag cut into characters after the spaces reads them
    once per character of the tag)."""
    work = []
    for n in (4000, 8000):
        parser = CountingParser(name)
        stream = ReasoningStream(parser)
        pieces = ["hmm ", "<tool_call>", *[" "] * n, *tail]
        out = [stream.feed(p) for p in pieces] + [stream.feed("", final=True)]
        joined = ("".join(r for r, _ in out), "".join(c for _, c in out))
        assert joined == streamed(name, "".join(pieces), [])  # the same split as the whole text
        work.append(parser.read)
    assert work[1] <= 2.2 * work[0] and work[1] <= 32 * (8000 + 40), work


def test_split_is_the_stream_module_split():
    assert split is split_text
