"""Passive health of the replica set: what answers say about each replica, and its ejections (Envoy's outlier
detection; the bookkeeping is router/routing/outlier.py, the deadlines router/replicas/patience.py).

- Every failed answer is counted (``ReplicaFailures``, router/http/failures.py, which the data plane calls); a
  sick one, or enough in a row, ejects the replica -- never the last one in rotation.
- Each poll of ``/load`` (router/control/probes.py) is held against the last one: a prefill queue that shrank
  or KV events that moved are progress, credited to the last poll (the change came after it), and keep the
  router waiting for the replica's slow answers.
- An ejected replica answering ``/health`` stays out; once its ejection is over, one probe request (a
  one-token completion) must be answered within ``first_byte_timeout_s``, else it is ejected again, for longer.
  A replica whose ``/health`` fails is down, not sick: its ejection is lifted and ``/health`` brings it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.serving.load_report import LoadReport
from kvmesh.router.http.failures import ReplicaFailures
from kvmesh.router.http.upstream import UpstreamError

if TYPE_CHECKING:
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.event_feed import EventFeed
    from kvmesh.router.control.kv_peers import KVPeerRegistry
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.http.metrics import RouterMetrics
    from kvmesh.router.replicas.foreign_load import ForeignLoad
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.kv_router import KVRouter

logger = logging.getLogger(__name__)


class PassiveHealth:
    """See the module doc; one per ``RouterRuntime``, on its event loop."""

    def __init__(self, config: RouterConfig, router: KVRouter, metrics: RouterMetrics, calls: ReplicaCalls,
                 feed: EventFeed, kv_peers: KVPeerRegistry) -> None:
        """``feed``: whose subscriber's seqs show progress; ``kv_peers``: told before a probe re-admits a replica."""
        self.config, self.router, self.metrics, self.calls, self.feed, self.kv_peers = (
            config, router, metrics, calls, feed, kv_peers)
        self.replicas = router.replicas
        """The router's replicas: each record holds its health, patience, last poll's marks and probe request."""
        self.failures = ReplicaFailures(config, router, metrics)
        """What the answers say: failures counted, ejections (router/http/failures.py)."""
        self.outliers = self.failures.outliers

    async def stop(self) -> None:
        tasks = [r.probe_trial for r in self.replicas if r.probe_trial is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- polls
    def check_progress(self, replica: Replica, report: LoadReport | ForeignLoad, queued_prefill: int) -> None:
        """Note progress when the replica's prefill queue shrank or its KV events moved since the last poll
        (a replica stuck before its first byte shows neither), or a grammar is compiling on it (a request's own
        work, bounded by the replica's compile timeout: a slow compile is not the replica's failure)."""
        if isinstance(report, LoadReport) and report.num_grammar_compiles > 0:
            self.outliers.on_progress(replica)
        seq = report.kv_events_seq if isinstance(report, LoadReport) else None
        subscriber = self.feed.subscriber
        stats = subscriber.stats.get(replica.id) if subscriber is not None and replica.spec.events else None
        mark = (-1 if seq is None else seq, queued_prefill, stats.last_seq if stats is not None else -1,
                time.monotonic())
        if replica.removed:
            return
        last, replica.progress_mark = replica.progress_mark, mark
        if last is not None and (mark[0] > last[0] or mark[1] < last[1] or mark[2] > last[2]):
            self.outliers.on_progress(replica, at=last[3])  # it moved after the last poll

    def after_probe(self, replica: Replica, ok: bool) -> bool:
        """Take a ``/health`` probe's outcome; True while the replica is ejected (``/health`` must not re-admit
        it: its probe request is sent once its ejection is over)."""
        if not ok:
            self.outliers.on_down(replica)
            return False
        if not self.outliers.is_ejected(replica):
            return False
        if self.outliers.probe_due(replica) and not replica.removed and replica.probe_trial is None:
            replica.probe_trial = asyncio.create_task(self.try_ejected(replica, replica.spec))
        return True

    async def try_ejected(self, replica: Replica, spec: ReplicaSpec) -> None:
        """The probe request of a replica whose ejection is over (registered with ``spec``): a one-token
        completion answered within ``first_byte_timeout_s`` re-admits it; anything else ejects it again, for
        longer."""
        cfg, rid = self.config, replica.id
        body: dict[str, object] = {"prompt": "Hello", "max_tokens": 1, "stream": False}
        if cfg.served_name is not None:
            body["model"] = cfg.served_name
        timeout_s = cfg.upstream.first_byte_timeout_s or cfg.upstream.request_timeout_s or 60.0
        try:
            status, _, raw = await self.calls.requests.fetch("POST", spec.url, "/v1/completions", timeout_s,
                                                             msgspec.json.encode(body),
                                                             {"content-type": "application/json",
                                                              **self.calls.headers()})
            answered = status == 200 and isinstance(msgspec.json.decode(raw), dict)
            why = "" if answered else f"its probe request got HTTP {status}"
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            answered, why = False, f"its probe request failed: {e!r}"
        finally:
            current = not replica.removed and replica.spec is spec
            if current:
                replica.probe_trial = None
        if not current:
            return
        seconds = self.outliers.on_probe(replica, answered, why)
        if seconds is not None:
            self.metrics.child(self.metrics.replica_failures, rid, "probe").inc()
            self.failures.eject(replica, seconds)
        elif not replica.draining:
            logger.info("replica %s answered its probe request: back in rotation", rid)
            await self.kv_peers.before_healthy(replica)  # it may have restarted meanwhile: its pull peers again
            self.router.set_healthy(replica, True)
