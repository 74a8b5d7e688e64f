"""The peer pull planned with a routing decision: the chosen replica lacks leading blocks of the prompt that another
replica holds, and moving them beats computing them (router/routing/kv_placement.py prices it).

    pulls = PeerPulls(index, replicas, rules, fleet)      once per router
    pulls.plan(chosen, keys, tiers, num_prompt_tokens, excluded, pool) -> (PlannedPull | None, refused | None)

Whatever the policy, a pull moves only the blocks a holder's events confirmed, what it can hand over now
(``TierMatches.pullable``): never those credited to it for a request still queued there (a pull of them would move
nothing), never to a replica this router's replica set did not reach (``Replica.kv_peers_pending``: it would
compute the prompt instead), and never between replicas whose KV layouts differ (router/replicas/kv_share.py: the
replica would refuse it at the handshake). When the replica holding the most is of another layout, the pull comes
from the best holder of the chosen replica's layout, and ``refused`` says why the first was passed over (the route
receipt's ``kv_not_shared``). Called under the router's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from kvmesh.kvcache.reuse import reusable_blocks
from kvmesh.router.replicas.kv_share import share_refusal
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
             excluded: set[ReplicaId], pool: frozenset | None) -> tuple[PlannedPull | None, str | None]:
        """A pull for a request routed to ``chosen`` from the healthy replica (of any role, not ``excluded``, within
        ``pool``: another model's replica holds other KV; of ``chosen``'s KV layout) holding the most of its ``keys``
        beyond ``chosen``'s, when pulling pays, else None; and why a holder of more was refused (None: none was)."""
        index, replicas, rules = self.index, self.replicas, self.rules
        bs, device = index.block_size, tiers.device
        usable = reusable_blocks(num_prompt_tokens, bs)
        own = min(max(device.get(chosen.id, 0), tiers.host.get(chosen.id, 0)), usable)
        problem = chosen.load.kv_layout_problem  # transfer on, layout unusable: paired with none
        if not rules.peer_pulls or own >= usable or chosen.kv_peers_pending or \
                not (chosen.load.kv_transfer_enabled or problem):
            return None, None
        matches = tiers.pullable
        if matches is None:  # not matched for the policy: the holders that could add blocks, cut at their predictions
            more = {rid: m for rid, m in device.items() if m > own and rid != chosen.id}
            matches = index.held(keys, more) if more else more
        if not matches:
            return None, None
        if problem is not None:  # paired with none: said when another replica holds more
            more_elsewhere = any(m > own for rid, m in matches.items() if rid != chosen.id)
            return None, f"{chosen.id} is paired with no replica: {problem}" if more_elsewhere else None
        candidates = replicas.healthy_within(excluded, pool)
        holder, held, refused = self._holder(chosen, own, matches, candidates, usable)
        if holder is None and refused is not None:  # the best holder is of another layout: the best of chosen's
            alike = [r.id for r in replicas if r.id in candidates and not share_refusal(chosen, r)]
            holder, held, _ = self._holder(chosen, own, matches, alike, usable)
        if holder is None:
            return None, refused
        return plan_pull(chosen, own, holder, held, bs, rules, self.fleet()), refused

    def _holder(self, chosen: Replica, own: int, matches: Mapping[ReplicaId, int], candidates: Collection[ReplicaId],
                usable: int) -> tuple[Replica | None, int, str | None]:
        """(the candidate holding the most beyond ``own``, its blocks, None) when KV can move between it and
        ``chosen``; (None, own, why not) when it cannot; (None, own, None) when none holds more."""
        holder_id, held = pull_source(chosen, own, matches, candidates, usable)
        if holder_id is None or (holder := self.replicas.get(holder_id)) is None:  # the index names it by id
            return None, own, None
        refused = share_refusal(chosen, holder)
        return (None, own, refused) if refused is not None else (holder, held, None)
