"""The peer pull planned with a routing decision: the chosen replica lacks leading blocks of the prompt that another
replica holds, and moving them beats computing them (router/routing/kv_placement.py prices it).

    pulls = PeerPulls(index, replicas, rules, fleet)      once per router
    pulls.plan(chosen, keys, tiers, num_prompt_tokens, excluded, pool) -> PlannedPull | None

Whatever the policy, a pull moves only the blocks a holder's events confirmed, what it can hand over now
(``TierMatches.pullable``): never those credited to it for a request still queued there (a pull of them would move
nothing), and never to a replica this router's replica set did not reach (``Replica.kv_peers_pending``: it would
compute the prompt instead). Called under the router's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.replica import Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.routing.cost import FleetRates
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.kv_placement import KVPlacementRules, PlannedPull, plan_pull, pull_source
from kvmesh.router.routing.tier_matches import TierMatches


class PeerPulls:
    """Plans the peer pull of each routing decision of one router (its index, replicas, rules and fleet rates)."""

    def __init__(self, index: PrefixIndex, replicas: ReplicaSet, rules: KVPlacementRules,
                 fleet: Callable[[], FleetRates]) -> None:
        self.index = index
        self.replicas = replicas
        self.rules = rules
        self.fleet = fleet
        """The fleet's rates (router/routing/routable.py), asked for only when a pull is priced."""

    def plan(self, chosen: Replica, keys: Sequence[int], tiers: TierMatches, num_prompt_tokens: int,
             excluded: set[ReplicaId], pool: frozenset | None) -> PlannedPull | None:
        """A pull for a request routed to ``chosen`` from the healthy replica (of any role, not ``excluded``, within
        ``pool``: another model's replica holds other KV) holding the most of its ``keys`` beyond ``chosen``'s,
        when pulling pays; None otherwise."""
        index, replicas, rules = self.index, self.replicas, self.rules
        bs, device = index.block_size, tiers.device
        usable = reusable_blocks(num_prompt_tokens, bs)
        own = min(max(device.get(chosen.id, 0), tiers.host.get(chosen.id, 0)), usable)
        if not rules.peer_pulls or own >= usable or not chosen.load.kv_transfer_enabled or chosen.kv_peers_pending:
            return None
        matches = tiers.pullable
        if matches is None:  # not matched for the policy: the holders that could add blocks, cut at their predictions
            more = {rid: m for rid, m in device.items() if m > own and rid != chosen.id}
            matches = index.held(keys, more) if more else more
        if not matches:
            return None
        holder_id, held = pull_source(chosen, own, matches, replicas.healthy_within(excluded, pool), usable)
        if holder_id is None or (holder := replicas.get(holder_id)) is None:  # the index names it by id
            return None
        return plan_pull(chosen, own, holder, held, bs, rules, self.fleet())
