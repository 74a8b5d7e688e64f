"""The hostile requests of ``kvmesh bench soak``: bodies each of which must get a clean 4xx (an OpenAI-shaped error
object) and nothing else, a small fixed set drawn from by the run's seed: JSON nested past the parser's limit, numbers
past 64 bits, ``NaN``, schemas that cannot compile or nest too deep, a regex that cannot parse or is past the grammar
limit, an empty choice list, a forced tool that is not among the tools, an adapter that is not served, stored-response
ids that are not there, a truncated body. Their text is built once (the largest is about 100 kB)."""

from __future__ import annotations

import functools
import json
import random

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.soak_fleet import SERVED

DEPTH = 10_000
"""Nesting of the deep bodies."""
DIGITS = 100_000
"""Digits of the huge integer."""
_MSGS = [{"role": "user", "content": "Hi"}]


def _chat(**fields) -> str:
    return json.dumps({"model": SERVED, "messages": _MSGS, "max_tokens": 4, **fields})


def _deep_schema(levels: int) -> dict:
    schema: dict = {}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def _tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


@functools.cache
def bodies() -> dict[str, tuple[str, str]]:
    """Each hostile case: its label -> (path, the body's text)."""
    chat, resp = "/v1/chat/completions", "/v1/responses"
    head = f'{{"model": "{SERVED}", "max_tokens": 4, "messages": '
    return {
        "a list 10,000 deep": (chat, head + '[{"role": "user", "content": ' + "[" * DEPTH + "]" * DEPTH + "}]}"),
        "an object 10,000 deep": (chat, head + json.dumps(_MSGS) + ', "user": ' + '{"a":' * DEPTH + "0"
                                  + "}" * DEPTH + "}"),
        "max_tokens of 100,000 digits": (chat, f'{{"model": "{SERVED}", "messages": {json.dumps(_MSGS)}, '
                                         f'"max_tokens": {"9" * DIGITS}}}'),
        "temperature NaN": (chat, head + json.dumps(_MSGS) + ', "temperature": NaN}'),
        "seed past 64 bits": (chat, _chat(seed=10 ** 40)),
        "max_tokens negative": (chat, _chat(max_tokens=-5)),
        "schema of an unknown type": (chat, _chat(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "nonsense"}}})),
        "schema 200 levels deep": (chat, _chat(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": _deep_schema(200)}})),
        "regex that does not parse": (chat, _chat(structured_outputs={"regex": "(unclosed[a-"})),
        "regex past the grammar limit": (chat, _chat(structured_outputs={"regex": "(a|b)" * 20_000})),
        "empty choice list": (chat, _chat(structured_outputs={"choice": []})),
        "forced tool not among the tools": (chat, _chat(tools=_tool({"type": "object"}), tool_choice={
            "type": "function", "function": {"name": "g"}})),
        "tool parameters of an unknown type": (chat, _chat(tools=_tool({"type": "wat"}), tool_choice="required")),
        "adapter not served": (chat, _chat(model="soak-missing")),
        "responses: unknown previous id": (resp, json.dumps({"model": SERVED, "input": "x", "max_output_tokens": 4,
                                                             "previous_response_id": "resp_" + "0" * 32})),
        "responses: malformed previous id": (resp, json.dumps({"model": SERVED, "input": "x", "max_output_tokens": 4,
                                                               "previous_response_id": "../../etc/passwd"})),
        "responses: text.format that cannot compile": (resp, json.dumps({
            "model": SERVED, "input": "x", "max_output_tokens": 4,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}})),
        "a truncated body": (chat, head + '[{"role": "user", "content": "Hi'),
    }


def clean_refusal(status: int, text: str) -> str | None:
    """``None`` when a hostile request got what it must (a 4xx whose body is an error object), else why not."""
    if not 400 <= status < 500:
        return f"hostile answered {status}: {text[:120]}"
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without an OpenAI-shaped error: {text[:120]}"
    return None if isinstance(message, str) and message else f"{status} with an empty error message"


async def hostile(session: aiohttp.ClientSession, rng: random.Random) -> tuple[str, str | None]:
    """One hostile case drawn by ``rng``: its label, and ``None`` or why its answer was wrong."""
    label = rng.choice(sorted(bodies()))
    path, text = bodies()[label]
    async with session.post(path, data=text.encode(), headers={"Content-Type": "application/json"}) as r:
        return label, clean_refusal(r.status, await r.text())
