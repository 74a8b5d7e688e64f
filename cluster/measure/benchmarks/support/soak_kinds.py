"""The well-formed requests of ``kvmesh bench soak``, one coroutine per kind: each sends its request(s) through the
router and returns ``None`` when the answer is a complete success, else the reason it is not (a status and the error's
message, a wrong tool name, an output its constraint forbids, a stream that ended early). A finish at ``max_tokens``
is complete; a constrained output is checked against its constraint only when it stopped on its own.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Awaitable, Callable

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.soak_fleet import ADAPTERS, SERVED

PROMPTS = ("Tell me a story about a cat.", "Once upon a time, a girl found a box.", "What did the dog say?",
           "Lily and Tom went to the park.", "Write about the sun and the moon.", "Why is the sky blue?")
SCHEMAS = ({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
           {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                             "happy": {"type": "boolean"}}, "required": ["name", "happy"]},
           {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3})
REGEXES = (r"[a-z]{3,8}", r"(yes|no), [0-9]{1,3}", r"(a+)+b")
"""Patterns (the last nests quantifiers: catastrophic for a backtracking matcher, a plain automaton here)."""
CHOICES = (["cat", "dog", "bird"], ["yes", "no"], ["red", "green", "blue", "yellow"])
TOOLS = [{"type": "function", "function": {"name": name, "description": f"the {name.split('_')[1]}", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}}
         for name in ("get_weather", "get_time")]
TURNS = 3
"""Turns of one Responses conversation (each after the previous id)."""
ABORT_AFTER = 3
"""Stream chunks a client reads before it closes the connection."""

Kind = Callable[[aiohttp.ClientSession, random.Random], Awaitable["str | None"]]


async def post(session: aiohttp.ClientSession, path: str, body: dict) -> tuple[int, dict]:
    async with session.post(path, json=body) as r:
        text = await r.text()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, {"raw": text[:200]}


def failed(status: int, doc: dict) -> str | None:
    if status == 200:
        return None
    return f"{status}: {str(doc.get('error', doc))[:160]}"


def _chat(rng: random.Random, model: str = SERVED, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": 24,
            "temperature": 0.8, "seed": rng.randrange(1 << 30), **fields}


async def _message(session, body: dict) -> tuple[str | None, dict]:
    """The first choice of a chat completion (or why there is none)."""
    status, doc = await post(session, "/v1/chat/completions", body)
    if (err := failed(status, doc)) is not None:
        return err, {}
    choice = doc.get("choices", [{}])[0]
    if choice.get("finish_reason") not in ("stop", "length", "tool_calls"):
        return f"incomplete: finish_reason {choice.get('finish_reason')!r}", {}
    return None, choice


async def chat(session, rng) -> str | None:
    return (await _message(session, _chat(rng)))[0]


async def chat_lora(session, rng) -> str | None:
    return (await _message(session, _chat(rng, model=rng.choice(ADAPTERS))))[0]


async def completion_lora(session, rng) -> str | None:
    body = {"model": rng.choice(ADAPTERS), "prompt": rng.choice(PROMPTS), "max_tokens": 24, "seed": rng.randrange(99)}
    status, doc = await post(session, "/v1/completions", body)
    return failed(status, doc)


async def json_schema(session, rng) -> str | None:
    schema = rng.choice(SCHEMAS)
    err, choice = await _message(session, _chat(rng, max_tokens=48, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}))
    if err is None and choice["finish_reason"] == "stop":
        try:
            json.loads(choice["message"]["content"])
        except ValueError:
            return f"json_schema: not JSON: {choice['message']['content'][:80]!r}"
    return err


async def regex(session, rng) -> str | None:
    pattern = rng.choice(REGEXES)
    err, choice = await _message(session, _chat(rng, structured_outputs={"regex": pattern}))
    if err is None and choice["finish_reason"] == "stop" and not re.fullmatch(pattern, choice["message"]["content"]):
        return f"regex {pattern}: {choice['message']['content'][:80]!r} does not match"
    return err


async def choice(session, rng) -> str | None:
    options = rng.choice(CHOICES)
    err, got = await _message(session, _chat(rng, structured_outputs={"choice": options}))
    if err is None and got["finish_reason"] == "stop" and got["message"]["content"] not in options:
        return f"choice: {got['message']['content'][:80]!r} not among {options}"
    return err


async def tool_auto(session, rng) -> str | None:
    err, got = await _message(session, _chat(rng, max_tokens=48, tools=TOOLS, tool_choice="auto"))
    names = {t["function"]["name"] for t in TOOLS}
    for call in (got.get("message") or {}).get("tool_calls") or []:
        if call["function"]["name"] not in names:
            return f"tool_auto: a call to {call['function']['name']!r}"
    return err


async def tool_forced(session, rng) -> str | None:
    name = rng.choice(TOOLS)["function"]["name"]
    err, got = await _message(session, _chat(rng, max_tokens=64, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": name}}))
    if err is None and got["finish_reason"] != "length":
        calls = got["message"].get("tool_calls") or []
        if [c["function"]["name"] for c in calls] != [name]:
            return f"tool_forced {name}: calls {[c['function']['name'] for c in calls]}"
    return err


async def responses_turns(session, rng) -> str | None:
    """``TURNS`` stored turns, each after the previous id; the last retrieved, all deleted."""
    ids: list[str] = []
    for _ in range(TURNS):
        body = {"model": SERVED, "input": rng.choice(PROMPTS), "max_output_tokens": 16, "store": True,
                **({"previous_response_id": ids[-1]} if ids else {})}
        status, doc = await post(session, "/v1/responses", body)
        if (err := failed(status, doc)) is not None:
            return f"responses turn {len(ids) + 1}: {err}"
        if doc.get("status") not in ("completed", "incomplete"):
            return f"responses turn {len(ids) + 1}: status {doc.get('status')!r}"
        ids.append(doc["id"])
    async with session.get(f"/v1/responses/{ids[-1]}") as r:
        if r.status != 200:
            return f"responses retrieve: {r.status}"
    for rid in ids:
        async with session.delete(f"/v1/responses/{rid}") as r:
            if r.status != 200:
                return f"responses delete: {r.status}"
    return None


async def _stream(session, rng, abort: bool) -> str | None:
    body = _chat(rng, max_tokens=32, stream=True)
    chunks, done = 0, False
    async with session.post("/v1/chat/completions", json=body) as r:
        if r.status != 200:
            return f"{r.status}: {(await r.text())[:160]}"
        async for line in r.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: "):
                chunks += 1
                if b'"error"' in line:
                    return f"stream error: {line[:160]!r}"
            if abort and chunks >= ABORT_AFTER:
                r.close()  # the client goes away mid-stream
                return None
    return None if done else f"stream ended after {chunks} chunks without [DONE]"


async def stream_full(session, rng) -> str | None:
    return await _stream(session, rng, abort=False)


async def stream_aborted(session, rng) -> str | None:
    return await _stream(session, rng, abort=True)


KINDS: dict[str, tuple[Kind, int]] = {
    "chat": (chat, 2), "chat_lora": (chat_lora, 2), "completion_lora": (completion_lora, 1),
    "json_schema": (json_schema, 2), "regex": (regex, 1), "choice": (choice, 1), "tool_auto": (tool_auto, 2),
    "tool_forced": (tool_forced, 2), "responses_turns": (responses_turns, 2), "stream_full": (stream_full, 1),
    "stream_aborted": (stream_aborted, 2)}
"""Each well-formed kind and its weight in the mix."""
