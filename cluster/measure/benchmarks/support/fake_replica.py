"""The one fake replica of tests and benchmarks: stdlib asyncio HTTP/1.1, no model.

Answers ``POST /v1/completions`` and ``/v1/chat/completions`` (SSE when the body asks for
``"stream": true``), ``GET /load``, ``POST /tokenize``, ``POST /reset_prefix_cache`` and any other GET with a 200
JSON that satisfies the health and model probes of kvmesh's, sglang's and vLLM's routers. A stream is the
replica's name then ``!``, or with ``answer_max_tokens`` the body's ``max_tokens`` words ``" w0"``, ``" w1"``
...; a non-streamed answer is the name (tests read which replica answered). With a prefix cache
(``PrefixCache``: a real ``KVCacheManager``, its events on a real ``ZmqEventPublisher`` with replay and
snapshots) every prompt is "prefilled" through it and ``usage`` says how many tokens it held; it then also
plays the P/D and peer-pull contract (``kv_transfer_params``, ``/kv/lease``, ``/kv/release``: fake_kv_transfer.py).

``POST /fake/config`` changes the ``Faults`` (a first-byte delay, with or without progress in ``/load``, a
forced status, streams cut after their first chunk or stalled after a few, answers that are not JSON, a
clock skew or event lag, the publisher stopped or restarted, the scheduling policy ``/load`` says); ``GET
/fake/stats`` counts clients that left during the delay, the Authorization headers and ``priority`` fields seen.
Without a cache a response costs ~20 µs of CPU, so a router in front of it is measured almost alone::

    python -m kvmesh.cluster.measure.benchmarks.support.fake_replica --port 0 [--delay-ms 0] [--event-port 0 ...]
    # prints {"port": P, "url": ..., "events": ..., "replay": ...}
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

from kvmesh.cluster.measure.benchmarks.support.fake_adapters import FakeAdapters
from kvmesh.cluster.measure.benchmarks.support.fake_answers import JSONBody, completion_answer, json_answer
from kvmesh.cluster.measure.benchmarks.support.fake_delivery import deliver
from kvmesh.cluster.measure.benchmarks.support.fake_faults import Faults, client_left
from kvmesh.cluster.measure.benchmarks.support.fake_http import read_request
from kvmesh.cluster.measure.benchmarks.support.fake_kv_transfer import (
    BadTransferParams,
    FakeKVTransfer,
    with_headers,
)

if TYPE_CHECKING:
    from kvmesh.cluster.measure.benchmarks.support.prefix_cache import PrefixCache


class FakeReplica:
    """Serves the fake protocol on one port until cancelled (``handle`` is the connection callback)."""

    def __init__(self, name: str = "!", model: str = "stub", cache: PrefixCache | None = None,
                 faults: Faults | None = None, answer_max_tokens: bool = False, keep_bodies: bool = False,
                 words: bool = False) -> None:
        self.name = name
        self.model = model
        self.cache = cache
        self.faults = faults or Faults()
        self.answer_max_tokens = answer_max_tokens
        self.keep_bodies = keep_bodies
        self.words = words
        self._vocabulary: dict[str, int] = {}
        self.requests: list[JSONBody] = []
        """Completion bodies received (with ``keep_bodies``)."""
        self.num_completions = 0
        self.running = 0
        self.delaying: dict[int, float] = {}
        """Completions waiting out ``Faults.delay``: their number -> when they started."""
        self.cancelled = 0
        self.auth_seen: deque[str] = deque(maxlen=10_000)
        """Authorization headers of the last completions."""
        self.priorities_seen: deque[int | None] = deque(maxlen=10_000)  # their bodies' priority (None: none)
        self.tenants_seen: deque[str | None] = deque(maxlen=10_000)  # their x-kvmesh-tenant (None: none)
        self.kv = FakeKVTransfer(name, cache)
        """Leases, prefill handles and pulls (fake_kv_transfer.py)."""
        self.lora = FakeAdapters()
        """LoRA adapters "loaded" through vLLM's endpoints, listed in ``/v1/models`` (fake_adapters.py)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, path, headers, body = await read_request(reader)
                if not await self._answer(reader, writer, method, path, body, headers):
                    break
                if headers.get(b"connection", b"").lower() == b"close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: bytes,
                      path: bytes, raw: bytes, headers: dict[bytes, bytes]) -> bool:
        """Write the answer; False when the connection must close."""
        body: JSONBody = json.loads(raw) if raw.strip() else {}
        if method == b"POST" and path in (b"/v1/completions", b"/v1/chat/completions"):
            self.tenants_seen.append(headers[b"x-kvmesh-tenant"].decode() if b"x-kvmesh-tenant" in headers else None)
            return await self._complete(reader, writer, body, path == b"/v1/chat/completions",
                                        headers.get(b"authorization", b"").decode())
        status = 200
        if method == b"POST" and path == b"/fake/config":
            reply = self.configure(body)
        elif method == b"POST" and path == b"/tokenize":
            reply = {"count": len(self.token_ids(body))}
        elif path == b"/fake/stats":
            reply = {"cancelled": self.cancelled, "running": self.running, "auth_seen": list(self.auth_seen),
                     "priorities_seen": list(self.priorities_seen), "tenants_seen": list(self.tenants_seen),
                     "adapter_calls": self.lora.calls, **self.kv.stats()}
        elif method == b"POST" and path in (b"/kv/lease", b"/kv/release", b"/kv/peers"):
            status, reply = {b"/kv/lease": self.kv.lease, b"/kv/release": self.kv.release,
                             b"/kv/peers": self.kv.register}[path](body)
        elif path == b"/load":
            reply = self.load()
        elif method == b"POST" and path == b"/reset_prefix_cache":
            self.auth_seen.append(headers.get(b"authorization", b"").decode())
            reply = {"freed_blocks": self.cache.reset() if self.cache is not None else 0}
        elif method == b"POST" and path in (b"/v1/load_lora_adapter", b"/v1/unload_lora_adapter"):
            if path == b"/v1/load_lora_adapter" and self.faults.adapter_load_delay:
                await asyncio.sleep(self.faults.adapter_load_delay)
            status, reply = self.lora.call(path == b"/v1/load_lora_adapter", body,
                                           headers.get(b"authorization", b"").decode())
        elif method == b"GET":
            reply = {"status": "ok", "object": "list", "data": [{"id": self.model, "object": "model",
                     "owned_by": "fake", "root": self.model}, *self.lora.cards(self.model)],
                     "model_path": self.model, "tokenizer_path": self.model, "is_generation": True}
        else:
            reply = {}
        writer.write(json_answer(status, reply))
        await writer.drain()
        return True

    def configure(self, body: JSONBody) -> JSONBody:
        """``POST /fake/config``: new faults, the publisher stopped or restarted, the stats reset."""
        for f in dataclasses.fields(Faults):
            if f.name in body:
                setattr(self.faults, f.name, type(getattr(self.faults, f.name))(body[f.name]))
        if self.cache is not None and body.get("publisher") in ("stop", "restart"):
            self.cache.stop_publisher() if body["publisher"] == "stop" else self.cache.restart_publisher()
        self.kv.configure(body.get("kv_transfer"))
        if body.get("reset_stats"):
            self.cancelled = 0
            self.auth_seen.clear(), self.priorities_seen.clear(), self.tenants_seen.clear()
            self.kv.reset()
        return {"ok": True}

    def load(self) -> JSONBody:
        f, now = self.faults, time.monotonic()
        prefill = sum(max(0, int((f.delay - (now - t)) * 1000)) for t in self.delaying.values()) if f.progress else 0
        report: JSONBody = {"num_requests_running": self.running, "num_requests_waiting": 0, "kv_cache_usage": 0.0,
                            "num_waiting_prefill_tokens": prefill, "timestamp": time.time() + f.clock_skew}
        if self.cache is not None:
            report.update(self.cache.load_fields())
            if "kv_events_unsent_s" in report:  # its batches are stamped skewed and late (``prefill``), its
                stamped = f.clock_skew - f.event_lag  # publisher ages them by the true clock: the true wait
                report["kv_events_unsent_s"] = max(0.0, report["kv_events_unsent_s"] + stamped)
        if f.compiling:
            report["num_grammar_compiles"] = len(self.delaying)
        if f.prefill_tokens_per_s:
            report["prefill_tokens_per_s"] = f.prefill_tokens_per_s
        if f.max_num_seqs:
            report["max_num_seqs"] = f.max_num_seqs
        return {**report, "kv_transfer": self.kv.load_field(), "scheduling_policy": f.scheduling_policy or None}

    def token_ids(self, body: JSONBody) -> list[int]:
        """The prompt as token ids: a list of ids as sent; else a text prompt's (a chat's JSON) UTF-8 bytes,
        or with ``words`` one id per word of the prompt (the chat's contents)."""
        prompt, messages = body.get("prompt"), body.get("messages")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if not self.words:
            return list((json.dumps(messages) if messages is not None else str(prompt)).encode())
        text = "\n".join(str(m["content"]) for m in messages) if isinstance(messages, list) else str(prompt)
        return [self._vocabulary.setdefault(word, len(self._vocabulary)) for word in text.split()]

    async def _complete(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: JSONBody,
                        chat: bool, auth: str) -> bool:
        self.num_completions += 1
        if self.keep_bodies:
            self.requests.append(body)
        self.auth_seen.append(auth)
        self.priorities_seen.append(body.get("priority"))
        f = self.faults
        self.running += 1
        try:
            number = self.num_completions
            self.delaying[number] = time.monotonic()
            try:
                if f.delay and await client_left(reader, f.delay):
                    self.cancelled += 1
                    return False
            finally:
                del self.delaying[number]
            status = 400 if f.fail_every and self.num_completions % f.fail_every == 0 else f.status
            if status != 200:
                writer.write(json_answer(status, {"error": {"message": f"injected failure (HTTP {status})",
                                                      "type": "BadRequestError", "code": status}}))
                await writer.drain()
                return True
            ids, salt = self.token_ids(body), body.get("cache_salt")
            try:
                params = self.kv.params_of(body)
                pulled, outcome = (await self.kv.pull(params, ids, salt, auth) if params and
                                   params.get("do_remote_prefill") else (0, None))
            except BadTransferParams as e:
                writer.write(json_answer(400, {"error": {"message": str(e), "type": "BadRequestError", "code": 400,
                                                         "param": "kv_transfer_params"}}))
                await writer.drain()
                return True
            cached = pulled + (self.cache.prefill(ids, salt, f.clock_skew - f.event_lag) if self.cache else 0)
        finally:
            self.running -= 1
        max_tokens = body.get("max_tokens")
        pieces = (tuple(f" w{i}" for i in range(max_tokens if isinstance(max_tokens, int) else 16))
                  if self.answer_max_tokens else (self.name, "!"))
        stream_options = body.get("stream_options")
        with_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
        head, *chunks, tail = completion_answer(chat, bool(body.get("stream")), with_usage, self.model, self.name,
                                                pieces,
                                      len(ids), cached)
        if params is not None:
            self.kv.received.append(params)
            if params.get("do_remote_decode"):  # the prefill side: the answer carries the handle
                answer = json.loads(head.partition(b"\r\n\r\n")[2])
                head = json_answer(200, {**answer, "kv_transfer_params": self.kv.handle(ids, salt)})
            head = with_headers(head, {"x-kvmesh-kv-pulled-tokens": pulled, "x-kvmesh-kv-pulled-bytes":
                                       pulled * self.kv.bytes_per_token,
                                       **({"x-kvmesh-kv-pull": outcome} if outcome else {})})
        if f.grammar_compile_s and body.get("structured_outputs") is not None:
            head = with_headers(head, {"x-kvmesh-grammar-compile-s": f.grammar_compile_s})
        return await deliver(reader, writer, head, chunks, tail, f, bool(body.get("stream")))


async def serve(replica: FakeReplica, port: int) -> None:
    server = await asyncio.start_server(replica.handle, "127.0.0.1", port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    ends = replica.cache.endpoints() if replica.cache else {}
    print(json.dumps({"port": port, "url": f"http://127.0.0.1:{port}", **ends}), flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        if replica.cache is not None:
            replica.cache.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="!", help="what a completion answers (default: %(default)s)")
    ap.add_argument("--model", default="stub", help="the model it serves in /v1/models (default: %(default)s)")
    ap.add_argument("--port", type=int, default=0, help="port to bind on 127.0.0.1 (0 = free one)")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="wait before each completion answer")
    ap.add_argument("--event-port", type=int, default=None,
                    help="keep a prefix cache and publish its KV events on this port (0 = free one)")
    ap.add_argument("--replay-port", type=int, default=0, help="the publisher's replay port (0 = free one)")
    ap.add_argument("--block-size", type=int, default=16, help="the prefix cache's block size")
    ap.add_argument("--num-blocks", type=int, default=4096, help="the prefix cache's blocks")
    ap.add_argument("--answer-max-tokens", action="store_true",
                    help="answer max_tokens words (' w0', ' w1', ...) instead of the name and '!'")
    args = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from kvmesh.cluster.measure.benchmarks.support.prefix_cache import PrefixCache

    cache = (PrefixCache(args.name, args.block_size, args.num_blocks, args.event_port, args.replay_port)
             if args.event_port is not None else None)
    asyncio.run(serve(FakeReplica(args.name, args.model, cache=cache, faults=Faults(delay=args.delay_ms / 1e3),
                                  answer_max_tokens=args.answer_max_tokens), args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
