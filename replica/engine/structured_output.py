"""Structured outputs in the engine (vLLM v1's ``StructuredOutputManager``): grammars compile off the engine
thread, each step's constrained rows get a token bitmask, and each accepted token advances its matcher.

    add_request ─ check (a 400 naming the field) ─ compile in the pool (cached by the spec) ──┐
    scheduler: a constrained request waits until its grammar is ready                          ▼
    (engine/grammar_pool.py: compile processes, taken in turns by tenant, killed at the timeout or when every
    request waiting for the compile is gone)
    step: schedule ─ grammar_bitmask(rows that sample) ─ runner masks the logits ─ sample ─ accept(tokens)

The matcher moves only on tokens the host has accepted, so preemption and recomputation leave it as it is
(the recomputed tokens are not sampled again), and chunked prefill only meets it at the chunk that samples.
Async scheduling launches step N+1 before step N's token is known, and step N+1's mask depends on it: a
constrained request with a token in flight sits out one step (scheduler.py), so its mask is always exact.
A constraint with ``reasoning_end`` (the chat's reasoning parser's end tag) waits for it: until the output writes
that text the request is not masked and its matcher does not move, so the reasoning is free and the answer after it
is constrained (vLLM's ``reasoning_ended``). ``reasoning_end_pattern`` is the rest of the parser's rule, a match of
which ends the reasoning too (qwen3's: a tool call opened inside the thinking), the rule the answer is read by.
KV blocks, their hashes and events do not see any of this.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from kvmesh.replica.engine import xgrammar_backend
from kvmesh.replica.engine.grammar_pool import GrammarPool
from kvmesh.replica.engine.structured_output_request import StructuredOutputRequest
from kvmesh.replica.serving.grammar_config import StructuredOutputsConfig
from kvmesh.replica.serving.sampling_params import SamplingParamsError
from kvmesh.replica.step.scheduler_output import GrammarBitmask

if TYPE_CHECKING:
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
    from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams
    from kvmesh.replica.step.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)

def check_constraints(constraints: list[StructuredOutputsParams]) -> None:
    """``SamplingParamsError`` naming the field of the first constraint xgrammar cannot express (the replica's HTTP
    layer calls it on a worker thread, so a large schema is parsed neither on the event loop nor on the engine
    thread, which then finds it checked)."""
    for params in constraints:
        xgrammar_backend.check(params, StructuredOutputsConfig().any_whitespace)


class StructuredOutputManager:
    """The engine's grammars: checks, the compile pool and its cache, the bitmask, token acceptance."""

    def __init__(self, tokenizer: HFTokenizer | None, vocab_size: int, eos_token_ids: frozenset[int],
                 config: StructuredOutputsConfig | None = None) -> None:
        self.config = config or StructuredOutputsConfig()
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, sorted(eos_token_ids)
        self.live: dict[str, StructuredOutputRequest] = {}  # request id -> its grammar, while it runs
        self._compiling: set[str] = set()  # live ids whose grammar is not compiled yet
        self._reasoning: set[str] = set()  # live ids whose output is still reasoning (not masked yet)
        self._cache: dict[tuple, Future] = {}  # spec key -> its compilation (insertion order: oldest first)
        self.pool: GrammarPool | None = None
        self._pool_lock = threading.RLock()
        self._closed = False  # close() ran: warm starts nothing
        self.on_compiled: Callable[[], None] | None = None
        """Called (on the pool's thread) when a compile ends: the engine thread waiting only for grammars wakes."""
        self._filler: xgrammar_backend.BitmaskFiller | None = None

    def check(self, params: StructuredOutputsParams, num_prompt_tokens: int) -> None:
        """``SamplingParamsError`` naming the request's field when the constraint cannot be compiled."""
        if params.num_resumed_tokens >= num_prompt_tokens:
            raise SamplingParamsError(f"{params.field}.num_resumed_tokens", f"{params.field}.num_resumed_tokens="
                                         f"{params.num_resumed_tokens} must be below the prompt's {num_prompt_tokens} "
                                         "tokens")
        if self.tokenizer is None:
            raise SamplingParamsError(params.field, "structured outputs need the model's tokenizer, and this "
                                         "engine runs without one")
        future = self._cache.get(params.key)
        if future is None or _failed(future):
            xgrammar_backend.check(params, self.config.any_whitespace)

    def add_request(self, request: Request, params: StructuredOutputsParams) -> None:
        """Start compiling ``request``'s grammar (or take it from the cache); the scheduler waits for it."""
        key = params.key
        future = self._cache.pop(key, None)
        waited = future is None or _failed(future) or not future.done()  # decided now: a compile may end at once
        if waited:
            future = self._compile_pool().submit(key, params, params.tenant, request.request_id)
        future.add_done_callback(self._compiled)
        self._cache[key] = future  # newest last
        self._trim_cache()
        resumed = request.prompt_token_ids[len(request.prompt_token_ids) - params.num_resumed_tokens:] \
            if params.num_resumed_tokens else []
        grammar = request.structured_output = self.live[request.request_id] = StructuredOutputRequest(params, future,
                                                                                                       resumed, waited)
        self._compiling.add(request.request_id)
        if grammar.reasoning_ids is not None:
            self._reasoning.add(request.request_id)

    def _compiled(self, _: Future) -> None:
        if self.on_compiled is not None:
            self.on_compiled()

    @property
    def num_compiling(self) -> int:
        """Live requests waiting for their grammar."""
        return len(self._compiling)

    def _compile_pool(self) -> GrammarPool:
        with self._pool_lock:  # the engine thread, or warm's
            if self.pool is None:
                info = xgrammar_backend.tokenizer_info(self.tokenizer, self.vocab_size, self.eos_token_ids)
                self.pool = GrammarPool(info.serialize_json(), info, self.config)
                weakref.finalize(self, self.pool.close, 0)  # an engine dropped without close() ends its compiles
            return self.pool

    def warm(self) -> None:
        """Import xgrammar here and start the compile processes now (a server's start-up, on a thread of its own:
        ``StructuredOutputsConfig.warm_start``), so the first constrained request waits for neither; nothing
        without a tokenizer, without xgrammar installed, or once closed (a pool closed meanwhile starts none)."""
        if self.tokenizer is None:
            return
        try:
            with self._pool_lock:
                if self._closed:
                    return
                pool = self._compile_pool()
        except ImportError:  # the engine extra is not installed: constrained requests are refused anyway
            logger.info("xgrammar is not installed: no grammar compile processes to warm")
            return
        pool.warm()

    def _trim_cache(self) -> None:
        """Drop the compiles that failed (nothing in them to reuse: the spec compiles again when asked), then the
        oldest past cache_size of them or cache_memory bytes (a grammar compiled, and the text of its spec: a spec
        that never compiles is as large as its request sent)."""
        cache = self._cache
        for key in [key for key, future in cache.items() if _failed(future)]:
            del cache[key]
        while len(cache) > self.config.cache_size:
            del cache[next(iter(cache))]
        sizes = {key: len(key[1]) + (f.result().memory_size_bytes if f.done() and not _failed(f) else 0)
                 for key, f in cache.items()}  # a compile may fail meanwhile (the pool's thread)
        total = sum(sizes.values())
        for key in list(cache):
            if total <= self.config.cache_memory:
                break
            total -= sizes.get(key, 0)
            del cache[key]

    def poll(self) -> list[tuple[str, str]]:
        """Start the matchers of the grammars compiled since the last call (the engine thread, before it
        schedules); (request id, error) of those that failed to compile (or overran compile_timeout_s) or to
        resume."""
        failed = []
        for request_id in list(self._compiling):
            grammar = self.live[request_id]
            if grammar.future.done():
                self._compiling.discard(request_id)
                if (error := grammar.start()) is not None:
                    failed.append((request_id, error))
        return failed

    def compiling(self) -> list[str]:
        """Requests whose grammar is compiling and within its timeout (``/load``'s ``num_grammar_compiles``; another
        thread's call may meet a set changing size: ``RuntimeError``, to retry)."""
        live, since = self.live, time.monotonic() - self.config.compile_timeout_s
        return [rid for rid in self._compiling if (g := live.get(rid)) is not None and g.since >= since]

    def finish(self, request_id: str) -> None:
        grammar = self.live.pop(request_id, None)
        if request_id in self._compiling:  # its compile goes on only for the other requests waiting for it
            self._compiling.discard(request_id)
            if self.pool is not None:
                self.pool.release(grammar.params.key, request_id)
        if grammar is not None and _failed(grammar.future) and self._cache.get(grammar.params.key) is grammar.future:
            del self._cache[grammar.params.key]  # failed, or cancelled as it left: its spec is not kept (_trim_cache)
        self._reasoning.discard(request_id)

    def grammar_bitmask(self, sched: SchedulerOutput) -> GrammarBitmask | None:
        """The allowed next tokens of this step's constrained rows that sample (None: no such row)."""
        if len(self.live) == len(self._reasoning):
            return None
        live = self.live if not self._reasoning else {rid: g for rid, g in self.live.items()
                                                      if rid not in self._reasoning}
        ids = [sr.request_id for sr in sched.scheduled if sr.sample and sr.request_id in live]
        decodes = sched.decode_request_ids
        if len(live) < len(decodes):
            in_step = set(decodes)
            ids += [rid for rid in live if rid in in_step]
        else:
            ids += [rid for rid in decodes if rid in live]
        if not ids:
            return None
        bitmask = xgrammar_backend.allocate_bitmask(len(ids), self.vocab_size)  # [G, ceil(V / 32)] int32, all allowed
        if self._filler is None:
            self._filler = xgrammar_backend.BitmaskFiller(self.config.fill_threads)
        self._filler.fill([live[rid].matcher for rid in ids], bitmask)
        return GrammarBitmask(ids, xgrammar_backend.as_numpy(bitmask))

    def accept(self, sampled: dict[str, int]) -> list[tuple[str, str]]:
        """Advance the matchers of the constrained requests among ``sampled``; (request id, error) of tokens the
        grammar refused (a runner that ignored the mask)."""
        live, refused = self.live, []
        for request_id in [rid for rid in sampled if rid in live] if len(sampled) < len(live) else \
                [rid for rid in live if rid in sampled]:
            if request_id in self._reasoning:
                self._reason(live[request_id], request_id, sampled[request_id])
            elif not live[request_id].matcher.accept(sampled[request_id]):
                refused.append((request_id, f"token {sampled[request_id]} is not allowed by the request's "
                                            f"{live[request_id].params.field}"))
        return refused

    def _reason(self, grammar: StructuredOutputRequest, request_id: str, token: int) -> None:
        grammar.reason(token, self.tokenizer.decode)
        if grammar.reasoning_ids is None:
            self._reasoning.discard(request_id)

    def compiling_ids(self) -> list[str]:
        """The live requests still waiting for their grammar."""
        return list(self._compiling)

    def compile_stats(self) -> dict[str, float]:
        """The compile pool's counters (engine/grammar_pool.py), empty before the first compile."""
        return dict(self.pool.stats) if self.pool is not None else {}

    def close(self) -> None:
        with self._pool_lock:
            pool, self.pool, self._closed = self.pool, None, True
        if pool is not None:
            pool.close()  # a warm() that took it before starts a dispatcher that ends at once


def _failed(future: Future) -> bool:
    """A finished compile without a grammar (an error, a timeout, cancelled)."""
    return future.done() and (future.cancelled() or future.exception() is not None)
