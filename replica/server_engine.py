"""The server's view of the engine: an ``AsyncLLM`` plus what routers and /health need to know.

Keeps the HTTP layer independent of the engine's internals (one place to adapt) and adds:
an eager ``generate`` (bad input raises ValueError before the response starts), the ``/load``
report, and the health verdict (engine loop alive, TP group intact).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any

from kvmesh.replica.openai.responses import LoadReport


class EngineClient:
    """Async facade over one ``AsyncLLM`` (and its TP executor, if any)."""

    def __init__(self, async_llm: Any):
        self.llm = async_llm
        self.engine = async_llm.engine
        self.runner = self.engine.model_runner
        self.draining = False  # set by graceful shutdown: new requests get 503

    # ------------------------------------------------------------ facts
    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def block_size(self) -> int:
        return self.engine.config.block_size

    @property
    def num_kv_blocks(self) -> int:
        return self.engine.num_kv_blocks

    @property
    def tensor_parallel_size(self) -> int:
        return self.engine.config.tensor_parallel_size

    # ------------------------------------------------------------ requests
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: Any,
                       cache_salt: str | None = None) -> AsyncIterator[Any]:
        """Queue the request and wait for its first output; returns the stream of all outputs.

        Raises ValueError (the engine refused the input) before anything is streamed, and
        RuntimeError when the replica is shutting down or broken.
        """
        reason = self.dead_reason()
        if reason is not None:
            raise RuntimeError(f"replica cannot take requests: {reason}")
        agen = self.llm.generate(prompt_token_ids, params, request_id=request_id, cache_salt=cache_salt)
        try:
            first = await agen.__anext__()
        except StopAsyncIteration:
            return _empty()
        except BaseException:
            await agen.aclose()
            raise
        return _chain(first, agen)

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    def get_stats(self) -> Any:
        return self.llm.get_stats()

    def load_report(self) -> LoadReport:
        """Queue depth, KV usage and uncomputed prompt tokens (read racily from the engine thread's state)."""
        sched = self.engine.scheduler
        for _ in range(5):  # the engine thread may mutate the dict while we read it: retry
            try:
                requests = list(sched.requests.values())
                break
            except RuntimeError:
                continue
        else:
            requests = []
        waiting_tokens = sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in requests)
        return LoadReport(
            num_requests_running=len(sched.running), num_requests_waiting=len(sched.waiting),
            kv_cache_usage=float(self.engine.kv_cache_manager.usage), num_waiting_prefill_tokens=waiting_tokens,
            num_kv_blocks=self.num_kv_blocks, block_size=self.block_size)

    def dead_reason(self) -> str | None:
        """None while the replica can serve; otherwise why not."""
        if self.draining:
            return "shutting down"
        if self.llm.errored is not None:
            return f"engine loop died: {self.llm.errored!r}"
        if not self.llm.is_running:
            return "engine stopped"
        runner_dead = getattr(self.runner, "dead_reason", None)
        if runner_dead:
            return runner_dead
        return None

    def abort_all(self) -> int:
        """Abort every unfinished request (graceful shutdown's last resort); returns how many."""
        for _ in range(5):  # read racily: the engine thread may be mutating the dict
            try:
                ids = list(self.engine.scheduler.requests)
                break
            except RuntimeError:
                continue
        else:
            ids = []
        if ids:
            self.llm._submit(("abort", ids))  # AsyncLLM.abort without needing an event loop
        return len(ids)

    def num_unfinished(self) -> int:
        return self.engine.get_num_unfinished_requests()


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        if first.finished:
            return
        async for out in rest:
            yield out
    finally:
        await rest.aclose()  # an early close aborts the request (AsyncLLM's rule)


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover


def build_engine_client(config: Any, tokenizer: Any, model_runner: Any = None, event_publisher: Any = None,
                        **executor_kwargs: Any) -> EngineClient:
    """Engine (+ TP executor for tensor_parallel_size > 1) on its thread, behind an ``EngineClient``.

    ``tokenizer`` is a ``replica.openai.tokenizer.Tokenizer``: the engine detokenizes with the same HF
    tokenizer the server renders prompts with.
    """
    from kvmesh.replica.async_engine import AsyncLLM
    from kvmesh.replica.engine import LLMEngine

    if model_runner is None:
        from kvmesh.replica.tp_worker import make_model_runner

        model_runner = make_model_runner(config, **executor_kwargs)
    try:
        engine = LLMEngine(config, model_runner=model_runner, tokenizer=tokenizer.hf, event_publisher=event_publisher)
    except BaseException:
        if hasattr(model_runner, "shutdown"):
            model_runner.shutdown()
        raise
    # Everything built so far (model, every KV block object, tokenizer) lives as long as the server:
    # move it out of the garbage collector's generations so full collections do not rescan it.
    gc.collect()
    gc.freeze()
    return EngineClient(AsyncLLM(engine=engine))
