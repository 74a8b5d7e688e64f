"""A fake replica (``fake_replica.FakeReplica``) served on a thread of its own, for in-process tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvmesh.cluster.measure.benchmarks.support.fake_replica import FakeReplica


@dataclass
class RunningFake:
    """A fake replica served on a thread of its own (``serve_in_thread``)."""

    state: FakeReplica
    """The replica (its faults, stats and the bodies it kept)."""
    url: str = ""
    """``http://127.0.0.1:PORT``."""


@contextmanager
def serve_in_thread(replica: FakeReplica) -> Iterator[RunningFake]:
    """``with serve_in_thread(FakeReplica(...)) as fake: fake.url`` -- stopped on exit."""
    running, ready = RunningFake(replica), threading.Event()
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        server = await asyncio.start_server(replica.handle, "127.0.0.1", 0, backlog=1024)
        running.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        async with server:
            await server.serve_forever()

    task = loop.create_task(serve())

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("fake replica did not start")
    try:
        yield running
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(5)
