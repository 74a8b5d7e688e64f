"""``EngineThread``: the one thread that touches the engine.

    submit(command) ──SimpleQueue──▶ drain commands, between_steps(), step(), deliver outputs, repeat
                                                                          │
    each request's (event loop, asyncio.Queue) in ``streams`` ◀─ call_soon_threadsafe ┘

Commands are applied between two steps, never during one. An output whose caller left (its stream closed, its
event loop gone) ends its request and lets go of any lease it carried. If the loop itself dies, every open stream
gets a final "error" output saying why and ``errored`` keeps the exception.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future

from kvmesh.replica.engine.commands import (
    KV_COMMANDS,
    AddLoRA,
    AddRequest,
    EngineCommand,
    ReleaseLease,
    RemoveLoRA,
    ResetPrefixCache,
    answer,
    refuse,
)
from kvmesh.replica.engine.kv_transfers import EngineKVTransfers
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.step.outputs import RequestOutput

logger = logging.getLogger(__name__)

Stream = tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput]]


class EngineThread:
    """Steps ``engine`` on a daemon thread, applying submitted commands between steps and handing each output to
    its request's stream (``streams``, which callers add to and remove from)."""

    def __init__(self, engine: LLMEngine, kv_transfers: EngineKVTransfers) -> None:
        self.engine = engine
        self.kv_transfers = kv_transfers  # pulls in flight and leases (this thread only)
        self.streams: dict[str, Stream] = {}
        self.closed = False
        self.errored: BaseException | None = None  # set if the loop itself died
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._wake = threading.Event()
        kv_transfers.wake = self._wake.set  # a transfer worker thread saw a read move on
        engine.structured_output.on_compiled = self._wake.set  # a grammar compile ended
        self._thread = threading.Thread(target=self._run, name="kvmesh-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self.closed

    def submit(self, command: EngineCommand) -> None:
        """Queue ``command`` for the thread (any thread)."""
        self._commands.put(command)
        self._wake.set()

    def stop(self, timeout_s: float) -> bool:
        """Ask the loop to end and wait up to ``timeout_s``; whether the thread is gone."""
        self.closed = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def unread(self, out: RequestOutput) -> None:
        """An output nobody will read: a lease its request took at finish is let go (any thread)."""
        if out.kv_lease and (lease_id := out.kv_lease.get("remote_lease_id")):
            self.submit(ReleaseLease(lease_id, Future()))

    # -- on the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        try:
            engine.model_runner.bind_thread()  # its CUDA device, its graphs captured here
            while not self.closed:
                self._wake.clear()
                self._drain_commands()
                engine.kv_connectors.between_steps()
                for out in engine.step() if engine.has_unfinished_requests() else ():
                    self._deliver(out)
                if not engine.has_unfinished_requests() or engine.waits_only_for_remote_kvs \
                        or engine.waits_only_for_grammars:  # idle, or until a remote KV lookup or read, or a
                    self._wake.wait(engine.kv_connectors.idle_timeout())  # compile, wakes it
        except BaseException as e:  # a bug in the engine loop: fail every open stream, say why
            logger.exception("engine loop died")
            self.errored = e
            self.closed = True
            for request_id in list(self.streams):
                self._deliver(RequestOutput(request_id, [], [], [], finished=True, finish_reason="error",
                                            error=f"engine loop died: {e!r}"))

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, AddRequest):
                self._add_request(command)
            elif isinstance(command, AddLoRA | RemoveLoRA):
                self._lora_command(command)
            elif isinstance(command, ResetPrefixCache):
                answer(command.done, self.engine.reset_unreferenced())
            elif isinstance(command, KV_COMMANDS):
                self.kv_transfers.handle(command)
            else:
                self.engine.abort_request(command.request_ids)

    def _add_request(self, command: AddRequest) -> None:
        try:
            self.engine.add_request(command.request)
        except BaseException as e:
            refuse(command.accepted, e)
        else:
            if not answer(command.accepted, None):  # its caller gave up before it was accepted
                self.engine.abort_request(command.request.request_id)

    def _lora_command(self, command: AddLoRA | RemoveLoRA) -> None:
        try:
            done = (self.engine.add_lora(command.lora_request) if isinstance(command, AddLoRA)
                    else self.engine.remove_lora(command.lora_name))
        except Exception as e:  # noqa: BLE001 - the caller gets it (a refused adapter is a ValueError)
            refuse(command.done, e)
        else:
            answer(command.done, done)  # a caller gone leaves it done: loading twice is a no-op

    def _deliver(self, out: RequestOutput) -> None:
        stream = self.streams.get(out.request_id)
        try:
            if stream is not None:
                stream[0].call_soon_threadsafe(self._put, stream[1], out)
                return
        except RuntimeError:  # the caller's event loop is gone: nobody will read this request
            self.streams.pop(out.request_id, None)
        if not out.finished:  # its caller is gone (cancelled, or its stream closed): nobody reads it, end it
            self.engine.abort_request(out.request_id)
        self.unread(out)

    def _put(self, out_queue: asyncio.Queue[RequestOutput], out: RequestOutput) -> None:
        """On the caller's loop: hand ``out`` to its stream, unless the caller left since it was sent."""
        stream = self.streams.get(out.request_id)
        out_queue.put_nowait(out) if stream is not None and stream[1] is out_queue else self.unread(out)
