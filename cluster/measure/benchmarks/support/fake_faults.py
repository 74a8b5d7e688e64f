"""What a test makes the fake replica (fake_replica.py) do: its ``Faults``, set by ``POST /fake/config``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class Faults:
    """What a test makes the replica do (``POST /fake/config`` sets any of them)."""

    delay: float = 0.0
    """Seconds each completion waits before answering (a client that leaves meanwhile is counted)."""
    status: int = 200
    """Answer every completion with this HTTP status (200 = normally)."""
    cut: bool = False
    """Streams break after their first chunk, whole answers a few bytes before their end, as when the process dies."""
    clock_skew: float = 0.0
    """Seconds this replica's clock is ahead of the real one (its /load timestamp and event batches)."""
    event_lag: float = 0.0
    """Seconds event batches are stamped before their step: as if they reached the router that late."""
    token_delay: float = 0.0
    """Seconds between streamed tokens."""
    fail_every: int = 0
    """Every n-th completion fails with HTTP 400 (0 = none)."""
    stall_after: int = 0
    """Streams send this many chunks, then nothing more on an open connection (0 = never stall)."""
    garbage: bool = False
    """Answers are not JSON: a non-streamed 200 body of plain text, a stream's events ``data: garbage``."""
    progress: bool = False
    """While completions wait out ``delay``, ``/load`` shows a prefill queue that shrinks (a slow replica at
    work); without it nothing there moves (a sick replica)."""
    compiling: bool = False
    """While completions wait out ``delay``, ``/load`` says their grammars are compiling (``num_grammar_compiles``)
    and nothing else moves: a replica at a request's own work."""
    prefill_tokens_per_s: float = 0.0
    """The prefill rate ``/load`` reports (0: none reported)."""
    grammar_compile_s: float = 0.0
    """Seconds a completion with ``structured_outputs`` reports its compile took (``x-kvmesh-grammar-compile-s``)."""
    scheduling_policy: str = ""
    """The scheduling policy ``/load`` reports, ``fcfs`` or ``priority`` ("": none, as vLLM's server)."""
    max_num_seqs: int = 0
    """The ``max_num_seqs`` ``/load`` reports (the router's admission sends no more at once; 0: none reported)."""
    adapter_load_delay: float = 0.0
    """Seconds an adapter load (``POST /v1/load_lora_adapter``) takes before it answers (a large adapter, a slow
    disk)."""


async def client_left(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Wait ``seconds``; True as soon as the client closes its side (the router cancelled upstream)."""
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except asyncio.TimeoutError:
        return False
