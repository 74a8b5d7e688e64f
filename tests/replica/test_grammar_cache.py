"""What the engine's grammar cache keeps (engine/structured_output.py): grammars that compiled, within cache_size and
cache_memory counting each spec's own text; a compile that failed or was cancelled leaves nothing behind, however
large the spec its request sent."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from kvmesh.replica.engine.grammar_pool import CompileTimeout
from kvmesh.replica.engine.structured_output import StructuredOutputManager, StructuredOutputsConfig
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams


class _Pool:
    """The compile pool's interface, each compile's future left to the test; the last waiter to leave cancels it."""

    def __init__(self, cancel_on_release: bool = True) -> None:
        self.futures: dict[tuple, Future] = {}
        self.cancel_on_release = cancel_on_release
        """False: a running compile, cancelled later by the dispatcher thread (after its worker is killed)."""

    def submit(self, key: tuple, params: StructuredOutputsParams, tenant: str, request_id: str) -> Future:
        self.futures[key] = Future()
        return self.futures[key]

    def release(self, key: tuple, request_id: str) -> None:
        if self.cancel_on_release:
            self.futures[key].cancel()


def _manager(pool: _Pool | None = None, **config) -> StructuredOutputManager:
    manager = StructuredOutputManager(None, 512, frozenset({2}), StructuredOutputsConfig(**config))
    manager.pool = pool or _Pool()  # type: ignore[assignment]  # what _compile_pool hands out once made
    return manager


def _add(manager: StructuredOutputManager, request_id: str, words: int = 1000) -> StructuredOutputsParams:
    params = StructuredOutputsParams(choice=tuple(f"{request_id}-{i:056d}" for i in range(words)))
    manager.add_request(SimpleNamespace(request_id=request_id, prompt_token_ids=[1, 2, 3]), params)  # type: ignore[arg-type]
    return params


def test_a_compile_that_timed_out_leaves_the_cache_with_its_request():
    manager = _manager()
    params = _add(manager, "slow")
    manager.pool.futures[params.key].set_exception(CompileTimeout("did not compile within 0.5 s"))
    manager.finish("slow")
    assert manager._cache == {}


def test_a_compile_cancelled_as_its_request_left_leaves_the_cache():
    manager = _manager()
    _add(manager, "abandoned")
    manager.finish("abandoned")  # the last waiter: the pool cancels the compile
    assert manager._cache == {}


def test_compiles_that_failed_meanwhile_are_dropped_when_the_next_request_comes():
    """A compile cancelled after its request finished (its process was killed later) goes on the next add."""
    manager = _manager(_Pool(cancel_on_release=False))
    first = _add(manager, "a")
    manager.finish("a")
    manager.pool.futures[first.key].cancel()  # its worker killed, after the request was gone
    second = _add(manager, "b")
    assert list(manager._cache) == [second.key]


def test_the_specs_own_text_counts_toward_cache_memory():
    """Specs of 64 KB each, never compiled: 100 of them would hold 6 MB; a 200 KB budget keeps the newest three."""
    manager = _manager(cache_memory=200_000)
    keys = [_add(manager, f"r{i}").key for i in range(100)]
    assert len(keys[0][1]) > 60_000
    assert list(manager._cache) == keys[-3:]


def test_a_grammar_that_compiled_stays_cached_after_its_request():
    manager = _manager()
    params = _add(manager, "ok", words=2)
    manager.pool.futures[params.key].set_result(SimpleNamespace(memory_size_bytes=1000))
    manager.finish("ok")
    assert list(manager._cache) == [params.key]
