"""Passive health of the replica set: what answers say about each replica, and its ejections (Envoy's outlier
detection; the bookkeeping is router/routing/outlier.py, the deadlines router/replicas/patience.py).

- Every failed answer is counted here (``record_failure``, from router/http/failures.py); a sick one, or enough
  in a row, ejects the replica -- never the last one in rotation.
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
from kvmesh.router.http.upstream import UpstreamError
from kvmesh.router.replicas.patience import Patience
from kvmesh.router.routing.outlier import OutlierDetector

if TYPE_CHECKING:
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.event_feed import EventFeed
    from kvmesh.router.control.kv_peers import KVPeerRegistry
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.http.metrics import RouterMetrics
    from kvmesh.router.replicas.load import ForeignLoad
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
        self.outliers = OutlierDetector(config.outliers)

    def patience(self, replica_id: str) -> Patience | None:
        """The deadlines of the replica's answers (router/replicas/patience.py); None: none configured."""
        replica = self.replicas.get(replica_id)
        cfg = self.config.upstream
        if cfg.first_byte_timeout_s is None and cfg.stream_idle_timeout_s is None:
            return None
        if replica is None:  # removed meanwhile: the deadlines stand, kept nowhere
            return Patience(cfg.first_byte_timeout_s, cfg.stream_idle_timeout_s, lambda since: False)
        if replica.patience is None:
            replica.patience = Patience(cfg.first_byte_timeout_s, cfg.stream_idle_timeout_s,
                                        lambda since: self.outliers.progressed_since(replica, since))
        return replica.patience

    async def stop(self) -> None:
        tasks = [r.probe_trial for r in self.replicas if r.probe_trial is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- answers
    def record_failure(self, replica_id: str, why: str, kind: str, sick: bool = False) -> None:
        """Count a failure of the replica (``kind`` labels the metric); a ``sick`` one (its /health cannot vouch
        for it) or enough in a row eject it, unless no other replica would be left in rotation."""
        replica = self.replicas.get(replica_id)
        if replica is None:
            return
        self.metrics.child(self.metrics.replica_failures, replica_id, kind).inc()
        others = any(r.id != replica_id and r.healthy and r.health.ejected_until is None for r in self.replicas)
        seconds = self.outliers.on_failure(replica, why, can_eject=others, sick=sick)
        if seconds is not None:
            self.eject(replica, seconds)

    def eject(self, replica: Replica, seconds: float) -> None:
        h, replica_id = replica.health, replica.id
        logger.warning("replica %s ejected %s after %d failure(s) in a row (last: %s)", replica_id,
                       f"for {seconds:.0f}s, then until a probe request is answered" if seconds else
                       "until a probe request is answered", h.consecutive_failures, h.last_failure)
        self.metrics.child(self.metrics.ejections, replica_id).inc()
        self.router.set_healthy(replica_id, False)

    def mark_failed(self, replica_id: str, connect_error: bool, why: str = "failed", kind: str | None = "connect",
                    sick: bool = False) -> None:
        """A request to the replica failed (or, ``kind`` None, its /health probe, which is not counted): stop
        routing to it until a probe succeeds, and count the failure (``record_failure``). A refused connection
        means the process is gone and its cache with it: drop its tree."""
        replica = self.replicas.get(replica_id)
        if replica is not None and replica.healthy and not sick:
            logger.warning("replica %s %s; routing around it until it answers /health", replica_id, why)
        self.router.set_healthy(replica_id, False, clear_cache=connect_error)
        if kind is not None:
            self.record_failure(replica_id, why, kind, sick)

    # ---------------------------------------------------------------- polls
    def check_progress(self, spec: ReplicaSpec, report: LoadReport | ForeignLoad, queued_prefill: int) -> None:
        """Note progress when the replica's prefill queue shrank or its KV events moved since the last poll
        (a replica stuck before its first byte shows neither), or a grammar is compiling on it (a request's own
        work, bounded by the replica's compile timeout: a slow compile is not the replica's failure)."""
        replica = self.replicas.get(spec.replica_id)
        if replica is None:
            return
        if isinstance(report, LoadReport) and report.num_grammar_compiles > 0:
            self.outliers.on_progress(replica)
        seq = report.kv_events_seq if isinstance(report, LoadReport) else None
        subscriber = self.feed.subscriber
        stats = subscriber.stats.get(spec.replica_id) if subscriber is not None and spec.events else None
        mark = (-1 if seq is None else seq, queued_prefill, stats.last_seq if stats is not None else -1,
                time.monotonic())
        last, replica.progress_mark = replica.progress_mark, mark
        if last is not None and (mark[0] > last[0] or mark[1] < last[1] or mark[2] > last[2]):
            self.outliers.on_progress(replica, at=last[3])  # it moved after the last poll

    def after_probe(self, spec: ReplicaSpec, ok: bool) -> bool:
        """Take a ``/health`` probe's outcome; True while the replica is ejected (``/health`` must not re-admit
        it: its probe request is sent once its ejection is over)."""
        replica = self.replicas.get(spec.replica_id)
        if replica is None:
            return False
        if not ok:
            self.outliers.on_down(replica)
            return False
        if not self.outliers.is_ejected(replica):
            return False
        if self.outliers.probe_due(replica) and replica.probe_trial is None:
            replica.probe_trial = asyncio.create_task(self.try_ejected(spec))
        return True

    async def try_ejected(self, spec: ReplicaSpec) -> None:
        """The probe request of a replica whose ejection is over: a one-token completion answered within
        ``first_byte_timeout_s`` re-admits it; anything else ejects it again, for longer."""
        cfg, rid = self.config, spec.replica_id
        body: dict[str, object] = {"prompt": "Hello", "max_tokens": 1, "stream": False}
        if cfg.served_name is not None:
            body["model"] = cfg.served_name
        timeout_s = cfg.upstream.first_byte_timeout_s or cfg.upstream.request_timeout_s or 60.0
        try:
            status, _, raw = await self.calls.requests.fetch("POST", spec.url, "/v1/completions", timeout_s,
                                                             msgspec.json.encode(body),
                                                             {"content-type": "application/json", **self.calls.headers()})
            answered = status == 200 and isinstance(msgspec.json.decode(raw), dict)
            why = "" if answered else f"its probe request got HTTP {status}"
        except (UpstreamError, OSError, asyncio.TimeoutError, ValueError) as e:
            answered, why = False, f"its probe request failed: {e!r}"
        finally:
            replica = self.replicas.get(rid)
            if replica is not None and replica.spec is spec:
                replica.probe_trial = None
        if replica is None or replica.spec is not spec:
            return
        seconds = self.outliers.on_probe(replica, answered, why)
        if seconds is not None:
            self.metrics.child(self.metrics.replica_failures, rid, "probe").inc()
            self.eject(replica, seconds)
        elif not replica.draining:
            logger.info("replica %s answered its probe request: back in rotation", rid)
            await self.kv_peers.before_healthy(spec)  # it may have restarted meanwhile: its pull peers again
            self.router.set_healthy(rid, True)
