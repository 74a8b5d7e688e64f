"""Where a decision's KV moves (``KVRouter``'s part): the peer pull planned with a routing decision
(router/routing/peer_pulls.py plans it, pulls_landing.py counts it on its replica until it lands) and the
prefill/decode split of a prompt (router/routing/kv_placement.py chooses the prefill replica).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvmesh.router.replicas.replica import Replica
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import RouterKeyHasher
from kvmesh.router.routing.kv_placement import KVPlacementRules, SplitChoice, choose_split
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.peer_pulls import PeerPulls, PlannedPull
from kvmesh.router.routing.pulls_landing import PullsLanding
from kvmesh.router.routing.route_decision import RouteDecision
from kvmesh.router.routing.tier_matches import TierMatches


class PullPlanning:
    """``KVRouter``'s KV moves: a decision's pull planned and counted, a prompt's split chosen."""

    lock: threading.Lock
    replicas: ReplicaSet
    index: PrefixIndex
    hasher: RouterKeyHasher
    loads: LoadTracker
    transfers: KVPlacementRules
    """When prompts are split and prefixes pulled (router/routing/kv_placement.py)."""
    pulls: PeerPulls
    """Plans the peer pull of each decision (router/routing/peer_pulls.py)."""
    landing: PullsLanding
    """The pulls still landing on each replica (pulls_landing.py), counted on its load before a decision."""

    def _plan_pull(self, replica: Replica, keys: Sequence[int], tiers: TierMatches, num_tokens: int, excluded: set,
                   pool: frozenset | None, now: float | None, commit: bool) -> tuple[PlannedPull | None, str | None]:
        """The peer pull of a request routed to ``replica``, counted as landing there when ``commit`` (under the
        lock), and why a replica holding more could not hand it over (None: none was refused)."""
        pull, not_shared = self.pulls.plan(replica, keys, tiers, num_tokens, excluded, pool)
        if commit and pull is not None:
            self.landing.add(replica, pull, now)
        return pull, not_shared

    def forget_pull(self, decision: RouteDecision) -> None:
        """``decision``'s pull will not land: its attempt failed or was cancelled before its replica answered
        (router/http/in_flight.py). Its replica stops counting it at once (pulls_landing.py)."""
        if decision.pull is not None:
            with self.lock:
                self.landing.release(decision.replica, decision.pull)

    def choose_split(self, decision: RouteDecision, now: float | None = None) -> SplitChoice:
        """Where to prefill ``decision``'s prompt before its decode replica gets it (router/routing/kv_placement.py):
        no prefill replica when the prompt stays whole (none registered, or its uncached suffix is under
        ``pd_min_uncached_tokens``), and why when a wanted split is not made; ``now`` as ``route``'s."""
        if not self.replicas.num_prefill or decision.uncached_tokens < self.transfers.pd_min_uncached_tokens:
            return SplitChoice(None)
        num_tokens = decision.uncached_tokens + decision.predicted_hit_tokens
        with self.lock:
            self.loads.refresh()
            matches = self.index.match(decision.keys, now=now)
            return choose_split(self.replicas.prefill(decision.pool), decision.replica, decision.uncached_tokens,
                                matches, num_tokens, self.hasher.block_size, self.transfers)
