"""A stub replica with a real prefix cache: ``_stub_replica``'s HTTP, plus a ``KVCacheManager`` whose
events go out on a real ``ZmqEventPublisher`` (replay and snapshots), and honest ``cached_tokens``.

Completion prompts must be token ids (the router forwards its own). Each request is "prefilled" through
the cache (its blocks stay cached, LRU) and answered with one token; ``usage.prompt_tokens_details.
cached_tokens`` says how much of the prompt the cache held, so a client can measure the hit rate the
router's choices earn. Run as a script it prints one JSON line with its endpoints, then serves::

    python -m kvmesh.cluster.benchmarks._cached_replica [--block-size 16] [--num-blocks 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time

from kvmesh.cluster.benchmarks._stub_replica import StubReplica, _head
from kvmesh.events.publisher import PublisherConfig, ZmqEventPublisher
from kvmesh.events.schema import KVEventBatch
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager


class CachedReplica(StubReplica):
    """``StubReplica`` whose completions go through a prefix cache that publishes its events."""

    def __init__(self, name: str, block_size: int, num_blocks: int) -> None:
        super().__init__()
        self.name = name
        self._events: list = []
        self.manager = KVCacheManager(num_blocks, block_size, hash_seed=b"bench-secret", event_sink=self._events.append)
        self.publisher = ZmqEventPublisher(PublisherConfig(endpoint="bind://tcp://127.0.0.1:0",
                                                           replay_endpoint="tcp://127.0.0.1:0"),
                                           snapshot_source=self.manager.block_pool.snapshot_events)
        self._ids = itertools.count()

    def prefill(self, ids: list[int]) -> int:
        """Run a prompt through the cache (blocks stay cached); its cached tokens."""
        req = TokenRequest(f"{self.name}-{next(self._ids)}", ids)
        computed, cached = self.manager.get_computed_blocks(req)
        if self.manager.allocate_slots(req, len(ids) - cached, cached, computed) is None:
            cached = 0
        self.manager.free(req)
        if self._events:
            events, self._events[:] = list(self._events), []
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return cached

    async def _answer(self, writer: asyncio.StreamWriter, method: bytes, path: bytes, body: bytes) -> None:
        path = path.split(b"?")[0]
        if method == b"GET" and path == b"/load":
            reply = json.dumps({"num_requests_running": 0, "num_requests_waiting": 0,
                                "kv_cache_usage": self.manager.usage, "num_waiting_prefill_tokens": 0,
                                "timestamp": time.time(), "kv_events_seq": self.publisher.seq - 1,
                                "kv_events_unsent_s": self.publisher.unsent_s()}).encode()
        elif method == b"POST" and path == b"/v1/completions":
            self.requests += 1
            prompt = json.loads(body).get("prompt")
            ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else list(
                str(prompt).encode())
            cached = self.prefill(ids)
            reply = json.dumps({"id": "cmpl-cached", "object": "text_completion", "created": 0, "model": "stub",
                                "choices": [{"index": 0, "text": self.name, "logprobs": None, "finish_reason": "length"}],
                                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1,
                                          "total_tokens": len(ids) + 1,
                                          "prompt_tokens_details": {"cached_tokens": cached}}}).encode()
        else:
            await super()._answer(writer, method, path, body)
            return
        writer.write(_head(b"200 OK", len(reply)) + reply)
        await writer.drain()


async def serve(name: str, block_size: int, num_blocks: int) -> None:
    replica = CachedReplica(name, block_size, num_blocks)
    server = await asyncio.start_server(replica.handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}", "events": replica.publisher.endpoint,
                      "replay": replica.publisher.replay_endpoint}), flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        replica.publisher.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="cached")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=4096)
    args = ap.parse_args(argv)
    asyncio.run(serve(args.name, args.block_size, args.num_blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
