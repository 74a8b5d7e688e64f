"""The router's end of the KV event feed: batches into the index, the subscriber's word into degraded causes.

``EventFeed.start`` makes the ``EventSubscriber`` and hands it ``on_batch`` and ``on_status``; both run on the
subscriber's thread. A batch that would take a replica past ``max_source_blocks`` raises, which the
subscriber counts as a bad frame of that replica (and degrades it if that keeps happening).

**Quarantine.** A replica degraded for bad frames is routed to by load only, so what its stream says
is not used -- and it need not be held either: its tree is dropped at once and its batches are not
applied until one starts afresh (``AllBlocksCleared`` first: the snapshot resync the subscriber
asks for, or a restart) or the subscriber trusts it again (a source without snapshots relearns from
an empty tree). So a broken or hostile stream costs no index memory while degraded, however much it
sends; the subscriber bounds what decoding it costs (``degraded_source_bytes_per_s``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvmesh.events.schema import AllBlocksCleared, BlockStored
from kvmesh.events.subscribe.health import DEGRADED, RECOVERED, SNAPSHOT_APPLIED, UNRECOVERED
from kvmesh.router.control.published_loads import PublishedLoads
from kvmesh.router.replicas.replica import BAD_FRAMES
from kvmesh.router.routing.kv_router import KVRouter

if TYPE_CHECKING:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.subscribe.subscriber import EventSubscriber
    from kvmesh.router.control.stream_watch import StreamWatch
    from kvmesh.router.http.metrics import RouterMetrics

logger = logging.getLogger(__name__)


class EventFeed:
    """Applies one router's events (see the module doc): into ``router``, observed by ``metrics`` and checked by
    ``stream_watch``; ``config`` bounds the subscriber."""

    def __init__(self, router: KVRouter, metrics: RouterMetrics, stream_watch: StreamWatch,
                 config: SubscriberConfig) -> None:
        self.router, self.metrics, self.stream_watch, self.config = router, metrics, stream_watch, config
        self.subscriber: EventSubscriber | None = None
        """The KV event feed's subscriber (made by ``start``)."""
        self.replicas = router.replicas
        """The router's replicas: each record's ``stream`` says whether it is quarantined (``StreamState``)."""
        self.loads: PublishedLoads | None = None
        """The replicas' published loads (router/control/published_loads.py; made by ``start``)."""

    def on_batch(self, source: str, seq: int, batch) -> None:
        """Apply one batch (subscriber thread). Raising drops it: the subscriber counts it as a
        bad frame of ``source`` and degrades the source if that keeps happening."""
        replica = self.replicas.get(source)
        if replica is None:
            return  # removed meanwhile
        stream = replica.stream
        if stream.quarantined:
            if not batch.events or batch.events[0].__class__ is not AllBlocksCleared:
                stream.dropped_batches += 1
                return
            stream.quarantined = False  # a fresh start: what follows describes its cache again
        self._check_blocks_held(source, batch.events)
        self.router.apply_events(source, batch)
        if self.subscriber is not None and self.subscriber.replayed(source):
            return  # published long ago, applied now: how current the live stream is shows on its live batches
        stream.lag_s = self.metrics.observe_batch(batch.ts)
        self.stream_watch.on_batch(replica, batch.ts)

    def _check_blocks_held(self, source: str, events: list) -> None:
        held, stored = None, 0
        for event in events:
            if event.__class__ is AllBlocksCleared:
                held, stored = 0, 0
            elif event.__class__ is BlockStored:
                stored += len(event.block_hashes)
        if held is None:
            held = self.router.index.num_blocks(source)
        limit = self.config.max_source_blocks
        if held + stored > limit:
            raise ValueError(f"replica {source} would hold {held + stored} blocks; the limit is {limit} "
                             "(SubscriberConfig.max_source_blocks)")

    def on_status(self, source: str, status: str, detail: str) -> None:
        """The subscriber's word on a source (its thread): bad frames (quarantine, above), a loss it
        could not repair (the tree is dropped and a snapshot asked for), a snapshot applied."""
        replica = self.replicas.get(source)
        if replica is None:
            return  # removed meanwhile
        if status == DEGRADED:
            logger.warning("replica %s: event stream degraded (%s); routing to it by load only and "
                           "ignoring its events until it is resynced", source, detail)
            self.router.set_degraded(replica, detail, BAD_FRAMES)
            replica.stream.quarantined = True
            self.router.clear_cache(replica)
        elif status == RECOVERED:
            logger.info("replica %s: event stream trusted again (%s)", source, detail)
            replica.stream.quarantined = False
            self.router.set_degraded(replica, None, BAD_FRAMES)
        elif status == UNRECOVERED:
            self.router.clear_cache(replica)  # what it said may be wrong: forget it, relearn it
            snapshots = self.subscriber.snapshots_supported(source) is not False
            self.stream_watch.on_lost(replica, detail, snapshots)
            if snapshots:
                self.subscriber.resync(source)
        elif status == SNAPSHOT_APPLIED:
            self.stream_watch.on_snapshot(replica)

    def start(self) -> None:
        """Start the subscriber and the load feed (in the router's event loop)."""
        from kvmesh.events.subscribe.subscriber import EventSubscriber

        self.subscriber = EventSubscriber(on_batch=self.on_batch, config=self.config, on_status=self.on_status).start()
        self.loads = PublishedLoads(self.router, self.config, asyncio.get_running_loop())

    def close(self) -> None:
        """Stop following the replicas' events and loads (blocks up to a few seconds)."""
        if self.loads is not None:
            self.loads.close()
        if self.subscriber is not None:
            self.subscriber.close()
