"""The fake replica's prefix cache: a real ``KVCacheManager`` whose events go out on a real
``ZmqEventPublisher`` (replay and snapshots), so a router follows it as it follows a replica."""

from __future__ import annotations

import itertools
import threading
import time

from kvmesh.events.config import PublisherConfig
from kvmesh.events.publish.publisher import ZmqEventPublisher
from kvmesh.events.schema import AllBlocksCleared, KVEvent, KVEventBatch
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager


class PrefixCache:
    """Prompts "prefilled" through a prefix cache (their blocks stay cached, LRU), events published."""

    def __init__(self, name: str, block_size: int, num_blocks: int, event_port: int = 0, replay_port: int = 0,
                 publish: bool = True) -> None:
        self.name = name
        self.lock = threading.Lock()  # the publisher's thread asks for snapshots
        self.pending: list[KVEvent] = []
        self.manager = KVCacheManager(num_blocks, block_size, hash_seed=b"fake-secret", event_sink=self.pending.append)
        self.publisher: ZmqEventPublisher | None = None
        self._ids = itertools.count()
        if publish:
            self.publisher = ZmqEventPublisher(
                PublisherConfig(endpoint=f"bind://tcp://127.0.0.1:{event_port}",
                                replay_endpoint=f"tcp://127.0.0.1:{replay_port}"),
                snapshot_source=self.snapshot)
            self.publisher.publish([AllBlocksCleared()])
        self.publisher_config = (PublisherConfig(endpoint="bind://" + self.publisher.endpoint,
                                                 replay_endpoint=self.publisher.replay_endpoint)
                                 if self.publisher else None)
        """The publisher's config with the ports it got: a restarted publisher binds the same ones."""

    def snapshot(self) -> list[KVEvent]:
        with self.lock:
            return self.manager.block_pool.snapshot_events()

    def prefill(self, ids: list[int], salt: str | None, clock_offset: float = 0.0) -> int:
        """Runs the prompt through the cache; returns its cached tokens (events stamped ``clock_offset`` late/early)."""
        with self.lock:
            req = TokenRequest(f"{self.name}-{next(self._ids)}", ids, cache_salt=salt)
            computed, n = self.manager.get_computed_blocks(req)
            if self.manager.allocate_slots(req, len(ids) - n, n, computed) is None:
                n = 0
            self.manager.free(req)
            events, self.pending[:] = list(self.pending), []
        if events and self.publisher is not None:
            self.publisher.publish(KVEventBatch(ts=time.time() + clock_offset, events=events))
        return n

    def reset(self) -> int:
        """``POST /reset_prefix_cache``: every cached block freed (the fake holds none between requests), the
        events published; how many blocks."""
        with self.lock:
            freed = self.manager.reset_unreferenced()
            events, self.pending[:] = list(self.pending), []
        if events and self.publisher is not None:
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return freed

    def held_tokens(self, ids: list[int], salt: str | None) -> int:
        """Tokens of the prompt's leading full blocks cached here (at most all but its last token), untouched."""
        with self.lock:
            req = TokenRequest(f"{self.name}-held-{next(self._ids)}", ids, cache_salt=salt)
            held = self.manager.get_computed_blocks(req)[1]
            self.manager.free(req)  # never allocated: only its hasher goes
            return held

    def load_fields(self) -> dict[str, object]:
        """What ``GET /load`` adds: cache usage and the publisher's progress."""
        fields: dict[str, object] = {"kv_cache_usage": self.manager.usage}
        if self.publisher is not None:
            fields.update(kv_events_seq=self.publisher.seq - 1, kv_events_unsent_s=self.publisher.unsent_s())
        return fields

    def endpoints(self) -> dict[str, str]:
        if self.publisher is None:
            return {}
        return {"events": self.publisher.endpoint, "replay": self.publisher.replay_endpoint}

    def stop_publisher(self) -> None:
        """Its I/O thread ends: batches queue up, unsent (HTTP keeps serving)."""
        assert self.publisher is not None
        self.publisher._io.stop()
        self.publisher._thread.join(5)

    def restart_publisher(self) -> None:
        """A new publisher on the same ports."""
        assert self.publisher is not None and self.publisher_config is not None
        self.publisher.close()
        self.publisher = ZmqEventPublisher(self.publisher_config, snapshot_source=self.snapshot)

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
