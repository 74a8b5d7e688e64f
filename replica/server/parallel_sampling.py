"""Parallel sampling: the choices of one OpenAI request (a batch of prompts, ``n`` choices each, ``best_of``
candidates).

Every candidate is its own engine request (vLLM's parallel sampling fans out the same way):

    prompt i, candidate j  ->  request "{id}-{i * best_of + j}", seed + j when seeded (vLLM's child seeds)
    candidate 0 of a prompt is queued first; the others find its prompt blocks in the prefix cache.
    echo + logprobs: only candidate 0 computes the prompt logprobs (such a request cannot read the
    cache); its siblings reuse them, so they still share its blocks.
    best_of > n: the n candidates with the highest cumulative logprob win (OpenAI's "best").
    choice index = i * n + (rank among prompt i's choices), as vLLM numbers them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.protocol import EngineClient
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.outputs import PromptLogprobs, RequestOutput

if TYPE_CHECKING:
    from kvmesh.replica.openai.sampling_fields import SamplingFields

Outputs = AsyncIterator[RequestOutput]
"""One engine request's outputs, its final one last."""


@dataclass(slots=True)
class Candidate:
    """One engine request behind a choice."""

    request: EngineRequest
    """The engine request: its id is the OpenAI request's id + "-{prompt_index * per_prompt + sample_index}"."""
    prompt_index: int
    """Which prompt of the request's batch it samples."""
    sample_index: int
    """j in 0 .. best_of - 1 among its prompt's candidates."""

    @property
    def request_id(self) -> str:
        return self.request.request_id


def params_per_prompt(req: SamplingFields, prompts: list[list[int]], max_model_len: int,
                      default_max_tokens: int | None) -> list[SamplingParams]:
    """Each prompt's ``SamplingParams``: the first prompt's built from ``req``, the others' copies of them with their
    own max_tokens (the request's token lists are read and checked once, whatever the number of prompts)."""
    first = req.to_sampling_params(len(prompts[0]), max_model_len, default_max_tokens)
    return [first, *(req.to_sampling_params(len(ids), max_model_len, default_max_tokens, like=first)
                     for ids in prompts[1:])]


def plan_candidates(first: EngineRequest, prompts: list[list[int]], params: list[SamplingParams], num_choices: int,
                    best_of: int | None, user_wants_logprobs: bool, stream: bool = False) -> list[Candidate]:
    """Candidates for ``prompts`` (``params[i]`` belongs to prompt i), prompt by prompt, sample 0 first: copies of
    ``first`` (the request's own fields, prompt 0 and ``params[0]``; its ``remote_kv`` goes with the first only).
    When streaming, every candidate computes its own prompt logprobs (each choice echoes its prompt
    in its first chunk, before candidate 0 may have finished its prefill)."""
    per_prompt = max(best_of or num_choices, num_choices)
    if len(prompts) == 1 and per_prompt == 1:
        return [Candidate(first, 0, 0)]
    candidates = []
    for i, (prompt, base) in enumerate(zip(prompts, params, strict=True)):
        for j in range(per_prompt):
            sp = base
            if j > 0 or (per_prompt > num_choices and not user_wants_logprobs):
                sp = base.child(  # shares base's token lists, checked once
                    seed=None if base.seed is None else base.seed + j,
                    prompt_logprobs=base.prompt_logprobs if j == 0 or stream else None,
                    # ranking best_of candidates needs their tokens' logprobs
                    logprobs=0 if per_prompt > num_choices and base.logprobs is None else base.logprobs)
            request = msgspec.structs.replace(first, request_id=f"{first.request_id}-{i * per_prompt + j}",
                                              prompt_token_ids=prompt, sampling_params=sp,
                                              remote_kv=first.remote_kv if i == j == 0 else None)
            candidates.append(Candidate(request, i, j))
    return candidates


def choice_index(candidate: Candidate, num_choices: int) -> int:
    """The response's index of a streamed candidate (no best_of selection when streaming)."""
    return candidate.prompt_index * num_choices + candidate.sample_index


def select_choices(candidates: list[Candidate], finals: list[RequestOutput],
                   num_choices: int) -> list[tuple[int, Candidate, RequestOutput]]:
    """(index, candidate, final output) of the returned choices: per prompt the first ``num_choices``
    candidates, or with best_of the ``num_choices`` with the highest cumulative logprob."""
    by_prompt: dict[int, list[tuple[Candidate, RequestOutput]]] = {}
    for candidate, final in zip(candidates, finals, strict=True):
        by_prompt.setdefault(candidate.prompt_index, []).append((candidate, final))
    chosen = []
    for prompt_index, group in sorted(by_prompt.items()):
        if len(group) > num_choices:
            group = sorted(group, key=lambda cf: -(cf[1].cumulative_logprob or 0.0))[:num_choices]
        for rank, (candidate, final) in enumerate(group):
            chosen.append((prompt_index * num_choices + rank, candidate, final))
    return chosen


def prompt_logprobs_of(candidates: list[Candidate], finals: list[RequestOutput]) -> dict[int, PromptLogprobs]:
    """prompt index -> the prompt logprobs its candidate 0 computed."""
    return {c.prompt_index: f.prompt_logprobs for c, f in zip(candidates, finals, strict=True)
            if c.sample_index == 0 and f.prompt_logprobs is not None}


async def start_all(client: EngineClient, candidates: list[Candidate]) -> list[Outputs]:
    """Queue every candidate's request (in order) and wait for each one's first output; if one is refused, abort
    the others and raise its error (a ValueError is a 400 before any byte is sent). A lone candidate is started in
    this task (no gather), so its engine call runs under the request's own stack."""
    if len(candidates) == 1:
        return [await start_generation(client, candidates[0].request)]
    results = await asyncio.gather(*(start_generation(client, c.request) for c in candidates), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for r in results:
            if not isinstance(r, BaseException):
                await r.aclose()  # closing a stream early aborts its request
        raise errors[0]
    return results


async def start_generation(client: EngineClient, request: EngineRequest) -> Outputs:
    """Queues the request and waits for its first output; returns the stream of all its outputs.

    So bad input raises ValueError (a 400) before any byte is sent, and a draining or broken
    replica raises RuntimeError (a 503 a router retries elsewhere).
    """
    reason = client.dead_reason()
    if reason is not None:
        raise RuntimeError(f"replica cannot take requests: {reason}")
    agen = client.generate(request)
    try:
        first = await agen.__anext__()
    except BaseException:
        await agen.aclose()
        raise
    return chain(first, agen)


async def chain(first: RequestOutput, rest: Outputs) -> Outputs:
    """``first``, then what ``rest`` yields (closing it closes ``rest``)."""
    try:
        yield first
        if first.finished:
            return
        async for out in rest:
            yield out
    finally:
        await rest.aclose()  # an early close aborts the request (AsyncLLM's rule)


async def collect_all(streams: list[Outputs]) -> list[RequestOutput | None]:
    """Every stream's final output."""

    async def last(stream: Outputs) -> RequestOutput | None:
        final = None
        async for out in stream:
            final = out
        return final

    return list(await asyncio.gather(*(last(s) for s in streams)))


async def merge_streams(streams: list[Outputs],
                        interval: int | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from all streams as they come (``interval`` new tokens at a time: ``in_batches``);
    closing it closes them all."""
    streams = [in_batches(stream, interval) for stream in streams] if interval else streams
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None, Exception | None]] = asyncio.Queue()

    async def pump(i: int, stream: Outputs) -> None:
        try:
            async for out in stream:
                await queue.put((i, out, None))
        except Exception as e:  # noqa: BLE001 - re-raised in the consumer
            await queue.put((i, None, e))
        await queue.put((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, out, error = await queue.get()
            if error is not None:
                raise error
            if out is None:
                remaining -= 1
                continue
            yield i, out
    finally:  # the consumer left early or failed: stop the pumps (closing their streams aborts the requests)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


async def without_output(stream: Outputs) -> Outputs:
    """A request's outputs with the generated token taken out (``echo`` with ``max_tokens: 0``)."""
    try:
        async for out in stream:
            yield RequestOutput(
                out.request_id, out.prompt_token_ids, [], [], "", "", out.finished,
                "length" if out.finish_reason in ("stop", "length") else out.finish_reason, None,
                out.num_cached_tokens, out.error, out.metrics,
                new_logprobs=None if out.new_logprobs is None else [],
                logprobs=None if out.logprobs is None else [], prompt_logprobs=out.prompt_logprobs,
                num_host_cached_tokens=out.num_host_cached_tokens, error_param=out.error_param)
    finally:
        await stream.aclose()  # closing early aborts the request


async def in_batches(stream: Outputs, interval: int) -> Outputs:
    """A request's outputs ``interval`` new tokens at a time (vLLM's ``stream_interval``): the first and the last
    output go at once, the others are merged (their tokens, text and logprobs in order) until enough are held."""
    pending: RequestOutput | None = None
    first = True
    try:
        async for out in stream:
            pending = out if pending is None else _merged(pending, out)
            if first or out.finished or len(pending.new_token_ids) >= interval:
                yield pending
                pending, first = None, False
        if pending is not None:
            yield pending
    finally:
        await stream.aclose()  # closing early aborts the request


def _merged(held: RequestOutput, out: RequestOutput) -> RequestOutput:
    """``out`` carrying ``held``'s new tokens, text and logprobs before its own."""
    out.new_token_ids = held.new_token_ids + out.new_token_ids
    out.delta_text = held.delta_text + out.delta_text
    if held.new_logprobs is not None or out.new_logprobs is not None:
        out.new_logprobs = (held.new_logprobs or []) + (out.new_logprobs or [])
    out.prompt_logprobs = out.prompt_logprobs if out.prompt_logprobs is not None else held.prompt_logprobs
    return out
