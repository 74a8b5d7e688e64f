"""The router's end of its replicas' published loads (events/load.py): followed from each replica's replay socket,
checked at intake (events/load_check.py), applied to its load on the router's event loop
(``LoadTracker.apply_published``, which also books this router's requests there from then on).

A replica joins the load feed when it joins the router's set with a replay endpoint, and leaves it when it leaves.
A replica that publishes no load (vLLM: it answers the request with a replay end marker) is polled on ``/load``
as before; so is one whose published load stopped, or was refused, for ``PUBLISHED_FRESH_S``
(router/replicas/load.py): a tick every ``AGE_EVERY_S`` ages the bookings (``LoadTracker.age_published``).

The loop applies each replica's newest update once per turn whatever the feed's thread received meanwhile: a
source's updates cost the loop one call per turn at most, and the feed takes at most ``load_updates_per_s`` of them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from kvmesh.events.subscribe.load_feed import LoadFeed

if TYPE_CHECKING:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.load import ReplicaLoadUpdate
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

logger = logging.getLogger(__name__)

AGE_EVERY_S = 0.5
"""Seconds between two agings of the bookings (a fraction of ``BOOKING_MAX_AGE_S``)."""


class PublishedLoads:
    """Follows the published load of every replica of ``router`` that has a replay endpoint."""

    def __init__(self, router: KVRouter, config: SubscriberConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.router, self.config, self.loop = router, config, loop
        keypair = (config.curve_public_key, config.curve_secret_key) if config.curve_public_key else None
        self._lock = threading.Lock()
        self._newest: dict[str, ReplicaLoadUpdate] = {}  # replica id -> the newest update not applied yet
        self._stale: dict[str, int] = {}  # replica id -> updates not newer than the last applied (by epoch and seq)
        self.feed = LoadFeed(self._received, self._absent, curve_keypair=keypair,
                             updates_per_s=config.load_updates_per_s, update_burst=config.load_update_burst).start()
        router.replicas.on_added(self._added)
        router.replicas.on_removed(self._removed)
        for replica in router.replicas.records():
            self._added(replica)
        self._aging = loop.call_later(AGE_EVERY_S, self._age)

    def close(self) -> None:
        self._aging.cancel()
        self.feed.close()

    def counters(self) -> dict[str, dict[str, int]]:
        """Per replica id: the feed's counters (``LoadSource.counters``) and ``stale``, updates not newer than the
        last applied (any thread)."""
        out = self.feed.counters()
        for replica_id, stale in list(self._stale.items()):
            out.setdefault(replica_id, {})["stale"] = stale
        return out

    def _added(self, replica: Replica) -> None:
        spec = replica.spec
        if spec is not None and spec.replay:
            self.feed.add_source(replica.id, spec.replay, self.config.curve_server_key)

    def _removed(self, replica: Replica) -> None:
        if replica.spec is not None and replica.spec.replay:
            self.feed.remove_source(replica.id)
        self._stale.pop(replica.id, None)

    def _received(self, replica_id: str, update: ReplicaLoadUpdate) -> None:
        """The feed's thread: keep the newest, and ask the loop to apply it unless it was asked already."""
        with self._lock:
            first = not self._newest
            self._newest[replica_id] = update  # the event intake names its replica by id
        if first:
            self.loop.call_soon_threadsafe(self._apply)

    def _apply(self) -> None:
        with self._lock:
            newest, self._newest = self._newest, {}
        loads = self.router.loads
        for replica_id, update in newest.items():
            replica = self.router.replicas.get(replica_id)
            if replica is not None and not loads.apply_published(replica, update):
                self._stale[replica_id] = self._stale.get(replica_id, 0) + 1

    def _age(self) -> None:
        self.router.loads.age_published()
        self._aging = self.loop.call_later(AGE_EVERY_S, self._age)

    def _absent(self, replica_id: str) -> None:  # once per source (the feed's)
        logger.info("replica %s publishes no load on its event stream: its /load polls count", replica_id)
