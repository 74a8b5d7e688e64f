"""A decision credited to its replica (``KVRouter``'s part): its prompt's blocks predicted there (router/routing/
predictions.py), its session pinned, and what its first bytes teach: the held prediction released
(``RouterConfig.predict_hold_s``), the TTFT against the router's estimate (cost/correction.py).
"""

from __future__ import annotations

import threading
import time

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.cost import observe_ttft
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.policies.base import Policy
from kvmesh.router.routing.pulls_landing import PullsLanding
from kvmesh.router.routing.route_decision import RouteDecision
from kvmesh.router.routing.session import SessionTable


class Crediting:
    """``KVRouter``'s crediting: a decision's blocks and session, and what its first bytes say."""

    lock: threading.Lock
    index: PrefixIndex
    sessions: SessionTable
    landing: PullsLanding
    predict_hold_s: float
    ttft_target_s: float
    policy: Policy

    def commit(self, decision: RouteDecision, session_id: str | None = None, now: float | None = None) -> None:
        """Credit ``decision``'s replica with its prompt's blocks and pin its session, as ``route`` does unless told
        ``commit=False``."""
        if now is None and session_id is not None:
            now = time.monotonic()
        with self.lock:
            index = self.index
            if decision.index_version == index.predictions.version and not index.predictions.due(now):
                start = decision.held_blocks  # the index has not changed since the decision matched
            else:
                start = index.match(decision.keys, now=now).get(decision.replica_id, 0)
            decision.prediction = self._credit(decision.replica, decision.keys, session_id, now, start)
            if decision.pull is not None:
                self.landing.add(decision.replica, decision.pull, now)

    def _credit(self, replica: Replica, keys: list[int], session_id: str | None, now: float | None,
                start: int) -> int | None:
        """Pin the session to ``replica`` and credit it with ``keys[start:]`` (under the lock); the held
        prediction's ticket (``predict_hold_s``), else None."""
        if session_id is not None:
            self.sessions.pin(session_id, replica.id, now)
        if self.predict_hold_s > 0:
            return self.index.predict_held(replica.id, keys, now, start, self.predict_hold_s)
        self.index.predict(replica.id, keys, now=now, start=start)
        return None

    def release_prediction(self, decision: RouteDecision, now: float | None = None) -> None:
        """The replica sent the request's first bytes (its prompt is computed) or the request left it: its held
        prediction lasts ``predict_ttl_s`` more."""
        if decision.prediction is not None:
            with self.lock:
                self.index.predictions.release(decision.prediction, time.monotonic() if now is None else now)
            decision.prediction = None

    def observe_ttft(self, decision: RouteDecision, actual_s: float, target_s: float | None = None) -> None:
        """The routed request's first token came ``actual_s`` after routing, against a TTFT target of ``target_s``
        (None: the router's, ``admission.ttft_target_s``): learn the replica's correction
        (router/routing/cost/correction.py) and the policy's measure of the fleet (``Policy.observe_ttft``), and
        complete the receipt."""
        receipt, estimate = decision.receipt, decision.estimate
        if receipt is not None:
            receipt.actual_ttft_s = actual_s
        if estimate is None:  # not priced: nothing to learn
            return
        with self.lock:  # a replica gone meanwhile learns on its dropped record, harmlessly
            self.policy.observe_ttft(estimate, actual_s, self.ttft_target_s if target_s is None else target_s)
            observe_ttft(decision.replica.load, estimate.raw_s, actual_s)
