"""A fake replica for router tests: real prefix cache (KVCacheManager) + real event publisher, no model.

Prompts must be token ids (text is turned into bytes). Each request is "prefilled" through the
real ``KVCacheManager`` (so BlockStored/BlockRemoved go out on a real ``ZmqEventPublisher``, with
replay and snapshots), answered with one token per chunk, and freed (its blocks stay cached).
``POST /fake/config`` sets a first-byte delay, a forced HTTP status, ``cut`` (streams break after
their first chunk, as when the process dies), a clock skew or event lag, or stops / restarts the event
publisher (``"publisher": "stop"`` / ``"restart"``; HTTP keeps serving); ``GET /fake/stats`` counts requests whose client
went away during the delay (``cancelled``) and the Authorization headers seen. Run as a script it prints
one JSON line with its endpoints, then serves until killed::

    python tests/router/fake_replica.py --name a --port 0 --event-port 0 --replay-port 0
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from kvmesh.events.publisher import PublisherConfig, ZmqEventPublisher
from kvmesh.events.schema import AllBlocksCleared, KVEventBatch
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

_ids = itertools.count()


class FakeReplica:
    def __init__(self, name: str, block_size: int, num_blocks: int, event_port: int, replay_port: int):
        self.name = name
        self.lock = threading.Lock()
        self.pending: list = []
        self.manager = KVCacheManager(num_blocks, block_size, hash_seed=b"fake-secret", event_sink=self.pending.append)
        self.publisher = ZmqEventPublisher(
            PublisherConfig(endpoint=f"bind://tcp://127.0.0.1:{event_port}",
                            replay_endpoint=f"tcp://127.0.0.1:{replay_port}"),
            snapshot_source=self.snapshot)
        self.publisher.publish([AllBlocksCleared()])
        self.publisher_config = PublisherConfig(endpoint="bind://" + self.publisher.endpoint,
                                                replay_endpoint=self.publisher.replay_endpoint)
        """Its publisher's config with the ports it got: a restarted publisher binds the same ones."""
        self.delay = 0.0
        self.status = 200
        self.cut = False
        self.running = 0
        self.cancelled = 0
        self.auth_seen: list[str] = []
        self.clock_skew = 0.0
        """Seconds this replica's clock is ahead of the real one (its /load timestamp and event batches)."""
        self.event_lag = 0.0
        """Seconds event batches are stamped before their step: as if they reached the router that late."""

    def snapshot(self):
        with self.lock:
            return self.manager.block_pool.snapshot_events()

    def prefill(self, ids: list[int], salt: str | None) -> int:
        """Runs the prompt through the prefix cache; returns its cached tokens."""
        with self.lock:
            req = TokenRequest(f"{self.name}-{next(_ids)}", ids, cache_salt=salt)
            computed, n = self.manager.get_computed_blocks(req)
            if self.manager.allocate_slots(req, len(ids) - n, n, computed) is None:
                n = 0
            self.manager.free(req)
            events, self.pending[:] = list(self.pending), []
        if events:
            self.publisher.publish(KVEventBatch(ts=time.time() + self.clock_skew - self.event_lag, events=events))
        return n

    @staticmethod
    async def _client_left(request: Request, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client disconnects (the router cancelled upstream)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if await request.is_disconnected():
                return True
            await asyncio.sleep(0.02)
        return False

    def build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/fake/config")
        async def config(request: Request):
            body = await request.json()
            self.delay = float(body.get("delay", self.delay))
            self.status = int(body.get("status", self.status))
            self.cut = bool(body.get("cut", self.cut))
            self.clock_skew = float(body.get("clock_skew", self.clock_skew))
            self.event_lag = float(body.get("event_lag", self.event_lag))
            if body.get("publisher") == "stop":  # its I/O thread ends: batches queue up, unsent
                self.publisher._io.stop()
                self.publisher._thread.join(5)
            elif body.get("publisher") == "restart":  # a new publisher on the same ports
                self.publisher.close()
                self.publisher = ZmqEventPublisher(self.publisher_config, snapshot_source=self.snapshot)
            if body.get("reset_stats"):
                self.cancelled, self.auth_seen = 0, []
            return {"ok": True}

        @app.get("/fake/stats")
        async def stats():
            return {"cancelled": self.cancelled, "running": self.running, "auth_seen": self.auth_seen}

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/load")
        async def load():
            return {"num_requests_running": self.running, "num_requests_waiting": 0,
                    "kv_cache_usage": self.manager.usage, "num_waiting_prefill_tokens": 0,
                    "timestamp": time.time() + self.clock_skew, "kv_events_seq": self.publisher.seq - 1,
                    "kv_events_unsent_s": self.publisher.unsent_s()}

        async def serve(request: Request, chat: bool):
            body = await request.json()
            prompt = body.get("prompt") if not chat else json.dumps(body.get("messages"))
            ids = list(prompt) if isinstance(prompt, list) else list(str(prompt).encode())
            self.auth_seen.append(request.headers.get("authorization", ""))
            self.running += 1
            try:
                if self.delay and await self._client_left(request, self.delay):
                    self.cancelled += 1
                    return JSONResponse({"error": {"message": "client left", "code": 499}}, status_code=499)
                if self.status != 200:
                    return JSONResponse({"error": {"message": "forced", "type": "x", "code": self.status}},
                                        status_code=self.status)
                cached = self.prefill(ids, body.get("cache_salt"))
            finally:
                self.running -= 1
            usage = {"prompt_tokens": len(ids), "completion_tokens": 2, "total_tokens": len(ids) + 2,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            if not body.get("stream"):
                return {"id": "cmpl-fake", "object": "text_completion", "model": body.get("model") or "fake",
                        "choices": [{"index": 0, "text": self.name, "finish_reason": "length"}], "usage": usage}

            async def chunks():
                for text in (self.name, "!"):
                    chunk = {"id": "cmpl-fake", "object": "text_completion", "model": "fake",
                             "choices": [{"index": 0, "text": text, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                    if self.cut:
                        await asyncio.sleep(0.05)  # let the first chunk leave, then die mid-stream
                        raise RuntimeError("fake replica died mid-stream")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'id': 'cmpl-fake', 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await serve(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await serve(request, chat=True)

        return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="fake")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--event-port", type=int, default=0)
    ap.add_argument("--replay-port", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--num-blocks", type=int, default=256)
    args = ap.parse_args()
    fake = FakeReplica(args.name, args.block_size, args.num_blocks, args.event_port, args.replay_port)
    server = uvicorn.Server(uvicorn.Config(fake.build_app(), host="127.0.0.1", port=args.port, log_level="warning"))

    async def run():
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(json.dumps({"url": f"http://127.0.0.1:{port}", "events": fake.publisher.endpoint,
                          "replay": fake.publisher.replay_endpoint}), flush=True)
        await task

    asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
