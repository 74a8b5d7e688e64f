"""The router's end of its replicas' published loads (events/load.py): followed from each replica's replay socket,
applied to its load on the router's event loop (``LoadTracker.apply_published``, which also books this router's
requests there from then on).

A replica joins the load feed when it joins the router's set with a replay endpoint, and leaves it when it leaves.
A replica that publishes no load (vLLM: it answers the request with a replay end marker) is polled on ``/load``
as before; so is one whose published load stopped for ``PUBLISHED_FRESH_S`` (router/replicas/load.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvmesh.events.subscribe.load_feed import LoadFeed

if TYPE_CHECKING:
    from kvmesh.events.config import SubscriberConfig
    from kvmesh.events.load import ReplicaLoadUpdate
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

logger = logging.getLogger(__name__)


class PublishedLoads:
    """Follows the published load of every replica of ``router`` that has a replay endpoint."""

    def __init__(self, router: KVRouter, config: SubscriberConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.router, self.config, self.loop = router, config, loop
        keypair = (config.curve_public_key, config.curve_secret_key) if config.curve_public_key else None
        self.feed = LoadFeed(self._received, self._absent, curve_keypair=keypair).start()
        router.replicas.on_added(self._added)
        router.replicas.on_removed(self._removed)
        for replica in router.replicas.records():
            self._added(replica)

    def close(self) -> None:
        self.feed.close()

    def _added(self, replica: Replica) -> None:
        spec = replica.spec
        if spec is not None and spec.replay:
            self.feed.add_source(replica.id, spec.replay, self.config.curve_server_key)

    def _removed(self, replica: Replica) -> None:
        if replica.spec is not None and replica.spec.replay:
            self.feed.remove_source(replica.id)

    def _received(self, replica_id: str, update: ReplicaLoadUpdate) -> None:
        """The feed's thread: apply on the event loop, where the router books its requests."""
        replica = self.router.replicas.get(replica_id)  # the event intake names its replica by id
        if replica is not None:
            self.loop.call_soon_threadsafe(self.router.loads.apply_published, replica, update)

    def _absent(self, replica_id: str) -> None:  # once per source (the feed's)
        logger.info("replica %s publishes no load on its event stream: its /load polls count", replica_id)
