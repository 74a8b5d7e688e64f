"""The routing decision: request tokens -> router keys -> prefix match -> policy -> replica.

``KVRouter`` is what the HTTP front (router/control/router_server.py), the simulator, the benchmarks and tests
drive. It holds the replica set, the index, the key hasher, the loads and the policy; it does no I/O. One concept
per part:

    kv_router.py        the decision: the candidates (routable.py) and their matches to the policy, its receipt
    crediting.py        the choice credited to its replica (``commit``), the prediction released at its first bytes,
                        the TTFT observed
    pull_planning.py    where its KV moves: the peer pull planned with it, the prefill/decode split
    event_intake.py     what the replicas report: KV events, health, degraded causes

Event batches may arrive on another thread (the subscriber's), so index updates and decisions
take one lock; each holds it for microseconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvmesh.router.replicas.replica import JOINING, READY, Replica, ReplicaId
from kvmesh.router.replicas.replica_set import ReplicaSet
from kvmesh.router.replicas.roles import BOTH, check_role
from kvmesh.router.routing.candidates import Candidates
from kvmesh.router.routing.cost.load_columns import LoadColumns
from kvmesh.router.routing.crediting import Crediting
from kvmesh.router.routing.event_intake import EventIntake
from kvmesh.router.routing.eviction_ghosts import EvictionGhosts
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import DEFAULT_ROUTER_SEED, RouterKeyHasher
from kvmesh.router.routing.kv_placement import KVPlacementRules, pull_priors
from kvmesh.router.routing.load import LoadTracker
from kvmesh.router.routing.peer_pulls import PeerPulls, PlannedPull
from kvmesh.router.routing.policies import Choice, NoReplicaError, Policy, get_policy
from kvmesh.router.routing.pull_planning import PullPlanning
from kvmesh.router.routing.pulls_landing import PullsLanding
from kvmesh.router.routing.receipts import Receipts, RouteReceipt, route_receipt
from kvmesh.router.routing.routable import RoutableLoads
from kvmesh.router.routing.route_decision import RouteDecision
from kvmesh.router.routing.session import SessionConfig, SessionTable
from kvmesh.router.routing.tier_matches import TierMatches

_ns = time.perf_counter_ns


class KVRouter(Crediting, EventIntake, PullPlanning):
    """Index + loads + health + policy: decides where each request goes."""

    def __init__(self, block_size: int = 16, policy: Policy | None = None, seed: int = DEFAULT_ROUTER_SEED,
                 predict_ttl_s: float = 2.0, sessions: SessionConfig | None = None,
                 salt_secret: bytes | None = None, transfers: KVPlacementRules | None = None,
                 predict_hold_s: float = 0.0, ttft_target_s: float = 1.0) -> None:
        """``policy``: None = the default policy (``DEFAULT_POLICY``: ``cache_aware_tokens``) with its defaults;
        ``seed``: root of the router keys; ``salt_secret``: the replicas' cache-salt key
        (``RouterKeyHasher.salt_secret``); ``transfers``: when KV may move between replicas (None: the defaults of
        ``KVPlacementRules``); ``predict_hold_s`` > 0: a routed prompt's prediction holds until its replica's first
        bytes (``release_prediction``, or ``observe_ttft``) and ``predict_ttl_s`` after, at most this long unreleased;
        ``ttft_target_s``: the TTFT target of a request observed without its own (``observe_ttft``).
        ``router.config.build_router`` builds one from a ``RouterConfig``."""
        self.lock = threading.Lock()
        self.replicas = ReplicaSet(self.lock)
        """One record per replica (router/replicas/): its role, health, degraded causes, load, ..."""
        self.hasher = RouterKeyHasher(block_size, seed, salt_secret)
        self.index = PrefixIndex(hasher=self.hasher, predict_ttl_s=predict_ttl_s)
        self.predict_hold_s = predict_hold_s
        self.ttft_target_s = ttft_target_s
        self.loads = LoadTracker(self.replicas)
        self.columns = LoadColumns(self.loads)
        """The loads as arrays, kept current (router/routing/cost/load_columns.py): a decision prices every candidate
        in one vectorised pass."""
        self.routable = RoutableLoads(self.replicas, self.columns)
        """The loads of the replicas a request may go to, as the policy gets them (router/routing/routable.py)."""
        if policy is None:
            policy = get_policy(block_size=block_size)
        self.policy = policy
        self.policy_name = policy.name
        self.transfers = transfers or KVPlacementRules()
        """When prompts are split and prefixes pulled (router/routing/kv_placement.py)."""
        policy.use_pulls(pull_priors(self.transfers))
        self.ghosts = EvictionGhosts() if policy.tracks_evictions else None  # only for a policy pricing comeback
        self.pullable = policy.prices_pulls and self.transfers.peer_pulls  # match what a pull can move (no predictions)
        self.pulls = PeerPulls(self.index, self.replicas, self.transfers, self.routable.fleet_rates)
        """Plans the peer pull of each decision (router/routing/peer_pulls.py)."""
        self.landing = PullsLanding()
        """The pulls still landing on each replica (pulls_landing.py), counted on its load before a decision."""
        policy.use_replicas(self.replicas)
        self.sessions = SessionTable(sessions)
        """Session id -> the replica of its last request (soft affinity, router/routing/session.py)."""
        self.receipts = Receipts(self.replicas, block_size)
        """Completed route receipts: captured / available reuse, predicted != actual (router/routing/receipts.py)."""
        self.events_applied = 0
        """Events applied from all replicas."""
        self.choices_out: Callable[..., int] | None = None
        """Tells the other routers of each request sent (router/control/router_sync.py ``publish``: its replica,
        booking, uncached tokens, keys and whether its prediction is held; the hold's number); None: it syncs with
        none."""
        self.holds_out: Callable[[Replica, int], None] | None = None
        """Tells them a held prediction's request was answered or left its replica (``RouterSync.release``)."""
        self.untrusted: set[Replica] = set()
        """The degraded replicas (``set_degraded``): their index matches are ignored."""
        self.replicas.on_added(lambda replica: self.index.add_replica(replica.id), locked=True)
        self.replicas.on_removed(self._removed, locked=True)

    @property
    def block_size(self) -> int:
        return self.hasher.block_size

    # ---------------------------------------------------------------- replica set
    def add_replica(self, replica_id: ReplicaId, healthy: bool = True, role: str = BOTH, spec: Any = None) -> Replica:
        """Register a replica of ``role`` (router/replicas/roles.py: prefill, decode or both) listening where ``spec``
        (its ``ReplicaSpec``, router/config.py) says; one already registered keeps its record (its role updated,
        made healthy when ``healthy``)."""
        return self.replicas.add(Replica(replica_id, check_role(role), spec, READY if healthy else JOINING, healthy))

    def remove_replica(self, replica_id: ReplicaId) -> Replica | None:
        """Forget a replica: its record goes, and the set's listeners drop what they keep of it."""
        return self.replicas.remove(replica_id)

    # ---------------------------------------------------------------- decisions
    def route(self, token_ids: Sequence[int], cache_salt: str | None = None, lora_name: str | None = None,
              exclude: Iterable[ReplicaId] = (), now: float | None = None,
              session_id: str | None = None, pool: frozenset | None = None, commit: bool = True,
              lora_identity: str | None = None) -> RouteDecision:
        """Choose a healthy replica (not in ``exclude``; in ``pool`` when given: the replicas serving the request's
        model or adapter) for a prompt; credits it with the prompt's blocks. ``lora_name`` and ``lora_identity`` (the
        identity of its weights the replicas report) key the prompt's blocks with its adapter, as the engine keys
        them.

        ``now`` is the clock that predictions and session pins expire by (``time.monotonic()`` when
        None; the simulator passes simulated time). ``session_id`` (a header or the request's
        ``user`` field) keeps a conversation on its replica while the policy's cost allows.
        Raises NoReplicaError when no candidate is left. ``commit=False`` decides without crediting the replica or
        pinning the session (a price for a request that may not go yet: router admission's queue head); ``commit``
        does it once the request goes.
        """
        t0 = _ns()
        keys = self.hasher.keys(token_ids, cache_salt, lora_name, lora_identity)
        t1 = _ns()
        if now is None and session_id is not None:
            now = time.monotonic()
        num_tokens, excluded = len(token_ids), set(exclude)
        with self.lock:
            matched = self.index.match_tiers(keys, now=now, pullable=self.pullable)
            version, t2 = self.index.predictions.version, _ns()  # the version the match was taken at
            candidates = self._routable(excluded, pool, now)
            tiers = matched.without(self._untrusted(matched))
            choice = self._decide(keys, tiers, candidates, num_tokens, lora_name, session_id, now)
            replica, estimate = choice.replica, choice.estimate
            pull, not_shared, held = self._credit_and_plan(replica, keys, tiers, num_tokens, excluded, pool,
                                                           session_id, now, commit)
        t3 = _ns()
        receipt = self._receipt(choice, bool(excluded), tiers, candidates, num_tokens, session_id, not_shared)
        return RouteDecision(replica, keys, tiers.either().get(replica.id, 0), receipt.predicted_hit_tokens,
                             num_tokens - receipt.predicted_hit_tokens, receipt.predicted_host_tokens, receipt,
                             {"hash": t1 - t0, "match": t2 - t1, "score": t3 - t2}, pull, receipt.predicted_ttft_s,
                             pool=pool, decided_at_ns=t0, prediction=held,
                             estimate=estimate if receipt.predicted_ttft_s is not None else None,
                             held_blocks=matched.device.get(replica.id, 0), index_version=version)

    def _receipt(self, choice: Choice, fallback: bool, tiers: TierMatches, candidates: Candidates, num_tokens: int,
                 session_id: str | None, not_shared: str | None) -> RouteReceipt:
        """``route``'s receipt: why its replica (a fallback, the session's pin or the policy), what it holds and costs
        there, and why a replica holding more could not hand its KV over (``not_shared``)."""
        replica = choice.replica
        why = "fallback" if fallback or replica.degraded else "session" if choice.by_session else None
        receipt = route_receipt(replica, tiers, candidates.loads, num_tokens, session_id, why, choice.estimate,
                                self.block_size)
        receipt.kv_not_shared = not_shared
        return receipt

    def _credit_and_plan(self, replica: Replica, keys: list[int], tiers: TierMatches, num_tokens: int,
                         excluded: set, pool: frozenset | None, session_id: str | None, now: float | None,
                         commit: bool) -> tuple[PlannedPull | None, str | None, int | None]:
        """``route``'s choice committed (``commit``: credited, and its pull counted as landing there) and its peer
        pull planned (under the lock), with why a replica holding more could not hand it over (None: none) and the
        ticket of its held prediction."""
        held = self._credit(replica, keys, session_id, now, tiers.device.get(replica.id, 0)) if commit else None
        return (*self._plan_pull(replica, keys, tiers, num_tokens, excluded, pool, now, commit), held)

    def _decide(self, keys: list[int], tiers: TierMatches, candidates: Candidates, num_tokens: int,
                lora_name: str | None, session_id: str | None, now: float | None) -> Choice:
        """The policy's choice among ``candidates``, the session's pin offered (under the lock); a policy answers with
        one of the records it was given."""
        choice = self.policy.decide(keys, tiers, candidates, num_tokens, lora_name,
                                    self._pinned(session_id, now, candidates))
        if choice.replica not in candidates:
            raise TypeError(f"policy {self.policy.name!r} chose {choice.replica!r}, not one of its candidates")
        return choice

    def _routable(self, excluded: set, pool: frozenset | None, now: float | None) -> Candidates:
        """``candidates`` with the other router processes' counts and the pulls landing at ``now`` taken in
        (call under the lock); NoReplicaError when none is left."""
        self.loads.refresh()  # other router processes' in-flight counts, when shared
        if self.landing:
            self.landing.count(now)
        candidates = self.candidates(excluded, pool)
        if not candidates:
            raise NoReplicaError("no healthy replica to route to (all are down, of role prefill or already "
                                 "failed this request); retry later or register a decode replica"
                                 if pool is None else "no healthy replica serves this model now (its replicas "
                                 "are down, of role prefill or already failed this request); retry later")
        return candidates

    def _untrusted(self, tiers: TierMatches) -> list[ReplicaId]:
        """The degraded replicas among those holding any of the prompt (their matches are not trusted)."""
        ids = {r.id for r in self.untrusted}
        return [r for tier in (tiers.device, tiers.host) for r in tier if r in ids] if ids else []

    def _pinned(self, session_id: str | None, now: float | None, candidates: Candidates) -> Replica | None:
        """The replica the session is pinned to, when it is a candidate (soft affinity, router/routing/session.py: the
        policy keeps it while its cost allows). Under the lock."""
        if session_id is None:
            return None
        pinned = self.sessions.get(session_id, now)
        return candidates.named(pinned) if pinned is not None else None

    def candidates(self, excluded: set, pool: frozenset | None = None) -> Candidates:
        """The healthy replicas that decode, less ``excluded``, within ``pool``, as the policy gets them (call under
        the lock; router/routing/routable.py)."""
        return self.routable.candidates(excluded, pool)
