"""A request's grammar compile seconds, in its response's ``x-kvmesh-grammar-compile-s`` header.

A constrained request's first output comes after its grammar compiled (the scheduler admits it then), so the
header is known before the first byte, for a stream too. The value is the seconds the compile processes spent on
the grammars its engine requests waited for (engine/structured_output.py: a grammar taken from the cache costs
nothing); its router charges them to the tenant's fair share (router/http/compile_charge.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmesh.replica.openai.compile_tenant import COMPILE_SECONDS_HEADER
from kvmesh.replica.server.parallel_sampling import chain

if TYPE_CHECKING:
    from kvmesh.replica.server.parallel_sampling import Outputs


async def compile_headers(streams: list[Outputs], constrained: bool) -> dict[str, str]:
    """The header for a request whose engine requests are ``streams`` (each re-chained with the first output it
    gives up); none for an unconstrained request, or one that waited for no compile."""
    if not constrained:
        return {}
    seconds = 0.0
    for i, stream in enumerate(streams):
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            continue
        streams[i] = chain(first, stream)
        seconds += first.grammar_compile_s
    return {COMPILE_SECONDS_HEADER: f"{seconds:.6f}"} if seconds > 0 else {}
