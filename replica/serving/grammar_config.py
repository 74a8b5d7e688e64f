"""How the engine compiles and caches grammars (``EngineConfig.structured_outputs``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StructuredOutputsConfig:
    """How the engine compiles and caches grammars (engine/structured_output.py, engine/grammar_pool.py)."""

    compile_processes: int = 2
    """Processes that compile grammars, the most compiles at once (the engine thread never compiles); waiting
    compiles take turns by the requests' ``user``."""
    compile_timeout_s: float = 10.0
    """A compile still running after this many seconds is stopped (its process killed and replaced) and its
    requests fail naming their field (a regex like ``(a{1000}){1000}`` compiles for minutes)."""
    cache_size: int = 256
    """Compiled grammars kept by their spec; the oldest is dropped past this many."""
    cache_memory: int = 64 << 20
    """Bytes of compiled grammars (with the text of their specs) kept by the engine, and the bound of each compile
    process's own xgrammar cache; the oldest is dropped past it. Compiles that failed are not kept."""
    any_whitespace: bool = False
    """JSON grammars let the model put whitespace between tokens; off, a small model closes its object instead of
    padding it (a request's ``disable_any_whitespace`` decides for itself)."""
    fill_threads: int = 1
    """Threads that fill a step's bitmask rows (in xgrammar, the GIL released); more pays off at large batches on
    a machine with cores to spare."""
    warm_start: bool = False
    """A replica server loads xgrammar and starts its compile processes at start-up, in the background, so its
    first constrained request waits for neither (about 1 s of CPU on a small machine, most of it xgrammar's import
    in the replica); off: on the first constrained request, which then waits about that long. Off by default: on,
    every replica's start pays it whether or not it ever serves a constrained request; turn it on where structured
    outputs or tool calls are common."""

    def __post_init__(self) -> None:
        if min(self.compile_processes, self.cache_size, self.cache_memory, self.fill_threads) < 1 \
                or not self.compile_timeout_s > 0:
            raise ValueError("structured outputs need compile_processes, cache_size, cache_memory and fill_threads "
                             ">= 1 and compile_timeout_s > 0")
