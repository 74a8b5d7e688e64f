"""How the fake replica's answer (fake_replica.py) leaves on the wire, as the test's ``Faults`` shape it: not JSON,
cut after its first part (the process "dies"), stalled after a few chunks until the client leaves, or slowed per
token.
"""

from __future__ import annotations

import asyncio

from kvmesh.cluster.measure.benchmarks.support.fake_answers import garbage_answer
from kvmesh.cluster.measure.benchmarks.support.fake_faults import Faults, client_left


async def deliver(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, chunks: list[bytes],
                  tail: bytes, faults: Faults, stream: bool) -> bool:
    """Write ``head``, then ``chunks`` (a stream's), then ``tail``, with the faults; False when the connection was
    cut or the client left (no answer was completed)."""
    if faults.garbage:
        writer.write(garbage_answer(stream))
        await writer.drain()
        return True
    if faults.cut and not chunks:  # a whole answer: part of its body, then the process dies
        writer.write(head[:-8])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()
        return False
    writer.write(head)
    for i, chunk in enumerate(chunks):
        if faults.stall_after and i == faults.stall_after:
            await writer.drain()
            return not await client_left(reader, 3600)  # stalled: nothing more until the client leaves
        if faults.token_delay:
            await asyncio.sleep(faults.token_delay)
        writer.write(chunk)
        if faults.cut:
            await writer.drain()
            await asyncio.sleep(0.05)  # let the first chunk leave, then die mid-stream
            writer.transport.abort()
            return False
    writer.write(tail)
    await writer.drain()
    return True
