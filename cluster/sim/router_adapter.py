"""The real router in front of the simulated replicas: a ``KVRouter`` (``RouterKeyHasher``,
``PrefixIndex`` with predictions, ``LoadTracker``, a policy from the registry), fed in-process (no
sockets) with the replicas' KV events and driven in simulated time.

Loads are what the HTTP router itself knows (its ``LoadTracker`` counters: requests in flight,
uncached prompt tokens not yet past prefill); the replicas' polled ``/load`` reports are not
simulated.
"""

from __future__ import annotations

import inspect
import time

from kvmesh.cluster.sim.config import SimConfig
from kvmesh.cluster.sim.request import SimRequest


def available_policies() -> list[str]:
    from kvmesh.router.policies import POLICIES

    return list(POLICIES)


def build_policy(name: str, kwargs: dict, block_size: int, seed: int):
    """``get_policy(name, block_size=..., seed=..., **kwargs)``, dropping the keyword arguments
    the policy does not take (so one ``--policy-arg`` can tune one policy of several)."""
    from kvmesh.router.policies import POLICIES, get_policy

    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; choose one of {sorted(POLICIES)}")
    options = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            options |= set(inspect.signature(klass.__init__).parameters)
    kwargs = {k: v for k, v in kwargs.items() if k in options}
    return get_policy(name, block_size=block_size, seed=seed, **kwargs)


class SimRouter:
    """A real ``KVRouter`` driven in simulated time, plus the dispatch/first-token/finish load
    accounting the HTTP front does around it."""

    def __init__(self, policy: str, config: SimConfig, replicas: list) -> None:
        from kvmesh.router.core import KVRouter

        self.block_size = config.block_size
        self.router = KVRouter(
            block_size=config.block_size,
            policy=build_policy(policy, config.policy_kwargs, config.block_size, config.seed),
            predict_ttl_s=config.predict_ttl_s,
        )
        for rep in replicas:
            self.router.add_replica(rep.replica_id)
        self.index = self.router.index
        self.tracker = self.router.loads
        self.policy_name = policy
        # -- measured --
        self.num_events = 0
        self.apply_s = 0.0

    def route(self, req: SimRequest) -> int:
        decision = self.router.route(req.all_token_ids, req.cache_salt, req.lora_name, now=req.arrival_s)
        rid = req.replica_id = decision.replica_id
        req.predicted_hit_tokens = decision.predicted_hit_tokens
        self.tracker.on_dispatch(rid, self._uncached(req))
        return rid

    def _uncached(self, req: SimRequest) -> int:
        return req.num_prompt_tokens - req.predicted_hit_tokens

    def on_first_tokens(self, rid: int, reqs: list[SimRequest]) -> None:
        for r in reqs:
            self.tracker.on_first_output(rid, self._uncached(r))

    def on_finished(self, rid: int, reqs: list[SimRequest]) -> None:
        for r in reqs:
            self.tracker.on_finish(rid, self._uncached(r), had_output=True)

    def apply(self, rid: int, events: list) -> None:
        t0 = time.perf_counter()
        self.router.apply_events(rid, events)
        self.apply_s += time.perf_counter() - t0
        self.num_events += len(events)
