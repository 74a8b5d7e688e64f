"""``dynamo``: NVIDIA Dynamo's KV router cost, at its shipped defaults, with only what Dynamo's router knows.

Read from ai-dynamo/dynamo ``lib/kv-router/src/scheduling/selector/default.rs`` (commit a4bdb9bf,
``DefaultWorkerScorer::worker_logit`` and ``pick_default_worker``) and the defaults of its ``KvRouterConfig``
(``overlap_score_credit`` 1.0, ``overlap_score_credit_decay`` 0.0, ``prefill_load_scale`` 1.0,
``decode_active_request_weight`` 0.0, ``host_cache_hit_weight`` 0.75, ``router_temperature`` 0.0; the same
defaults as its ``DynamoDefaultParams``). Per worker, in blocks::

    cost = prefill_load_scale * max(0, (active prefill tokens + prompt) / block_size
                                       - cached device blocks - 0.75 * cached host blocks past them)
           + active KV blocks with this request's

the lowest wins, exact ties at random (``fastrand`` among the tied there; this policy's seeded ``rng`` here).
With the default decay 0 the overlap credit is not scaled by the backlog, and the active-request term is 0.

What Dynamo's router knows, and where it comes from here:

- cached blocks: its radix tree fed by the workers' KV events (``tiers``: the router's index, device and host);
- active prefill tokens: its router-local prefill tracker (``ReplicaLoad.pending_prefill_tokens``: this router's
  uncached prompt tokens that have produced no output yet);
- active KV blocks: its router-local ``ActiveSequences``, each in-flight request's prompt blocks counted once per
  worker (shared prefixes once, ``router_assume_kv_reuse``). Kept here from the requests this policy routed,
  released oldest first when the router's in-flight count on the worker falls below what it holds (the policy
  is not told which request finished; requests of one worker mostly finish in the order they came).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from kvmesh.cluster.measure.sim.rivals.worker_keyed import Loads, Rival
from kvmesh.router.replicas.replica import ReplicaId
from kvmesh.router.routing.policies.base import PolicyConfig
from kvmesh.router.routing.policies.no_replica import check_candidates
from kvmesh.router.routing.tier_matches import TierMatches


@dataclass(frozen=True, slots=True)
class DynamoConfig(PolicyConfig):
    """The knobs of ``dynamo`` (its ``KvRouterConfig`` names and defaults)."""

    prefill_load_scale: float = 1.0
    """Weight of the prefill blocks left to compute (queued and this request's, less the cached ones)."""
    overlap_score_credit: float = 1.0
    """Blocks of prefill one cached device block saves."""
    host_cache_hit_weight: float = 0.75
    """Blocks of prefill one cached host-tier block saves."""

    def __post_init__(self) -> None:
        checked = (("prefill_load_scale", self.prefill_load_scale),
                   ("overlap_score_credit", self.overlap_score_credit),
                   ("host_cache_hit_weight", self.host_cache_hit_weight))
        for name, value in checked:
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


class WorkerBlocks:
    """One worker's active sequences: the distinct prompt blocks of the requests routed there still in flight."""

    __slots__ = ("requests", "blocks")

    def __init__(self) -> None:
        self.requests: deque[Sequence[int]] = deque()
        """The requests' prompt blocks, oldest first."""
        self.blocks: Counter[int] = Counter()
        """Block -> the requests holding it."""

    def release(self, in_flight: int) -> None:
        """Drop the oldest requests held beyond the worker's ``in_flight`` count."""
        held, counts = self.requests, self.blocks
        while len(held) > in_flight:
            for key in held.popleft():
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]

    def with_request(self, keys: Sequence[int]) -> int:
        """Active blocks once a request of ``keys`` joins."""
        counts = self.blocks
        if not counts:
            return len(set(keys))
        return len(counts) + sum(1 for k in set(keys) if k not in counts)

    def add(self, keys: Sequence[int]) -> None:
        self.requests.append(keys)
        self.blocks.update(set(keys))


class ActiveBlocks:
    """Dynamo's ``ActiveSequences`` of every worker, keyed as that router keys them: by worker id."""

    def __init__(self) -> None:
        self.workers: dict[ReplicaId, WorkerBlocks] = {}

    def worker(self, replica_id: ReplicaId) -> WorkerBlocks:
        """``replica_id``'s tracker (made empty on first use)."""
        found = self.workers.get(replica_id)
        if found is None:
            found = self.workers[replica_id] = WorkerBlocks()
        return found


class DynamoPolicy(Rival):
    name = "dynamo"
    config_type = DynamoConfig
    config: DynamoConfig

    def __init__(self, config: DynamoConfig | None = None, block_size: int = 16, seed: int | None = None) -> None:
        super().__init__(config, block_size, seed)
        self.active = ActiveBlocks()
        """Its router-local active-block tracker."""

    def costs(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
              num_prompt_tokens: int | None = None) -> dict[ReplicaId, float]:
        """Every candidate's cost in blocks (the lowest is chosen)."""
        c = self.config
        prompt = num_prompt_tokens if num_prompt_tokens is not None else len(request_keys) * self.block_size
        keys = list(request_keys)
        out, worker = {}, self.active.worker
        for rid, load in loads.items():
            active = worker(rid)
            active.release(load.in_flight)
            raw_prefill = (load.pending_prefill_tokens + prompt) / self.block_size
            device = tiers.device.get(rid, 0)
            host_beyond = max(0, tiers.host.get(rid, 0) - device)
            credit = c.overlap_score_credit * device + c.host_cache_hit_weight * host_beyond
            out[rid] = c.prefill_load_scale * max(0.0, raw_prefill - credit) + active.with_request(keys)
        return out

    def choose_worker(self, request_keys: Sequence[int], tiers: TierMatches, loads: Loads,
                      num_prompt_tokens: int | None = None, lora_name: str | None = None) -> ReplicaId:
        check_candidates(loads)
        costs = self.costs(request_keys, tiers, loads, num_prompt_tokens)
        best = min(costs.values())
        chosen = self.rng.choice([rid for rid, cost in costs.items() if cost == best])
        self.active.worker(chosen).add(list(request_keys))
        return chosen
