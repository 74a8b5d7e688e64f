"""The routing policy interface: pure (no I/O), fast, called once per request.

``choose(request_keys, matches, loads, num_prompt_tokens=None) -> replica_id``

- ``request_keys``: the request's router keys (one per full prompt block, router/routing/keys.py).
- ``matches``: replica id -> leading blocks of the prompt it holds (``PrefixIndex.match``);
  replicas holding nothing may be absent; replicas not in ``loads`` are ignored.
- ``loads``: the *candidate* replicas (healthy ones), id -> ``ReplicaLoad`` (router/routing/load.py).
- ``num_prompt_tokens``: the prompt length; defaults to ``len(request_keys) * block_size``.

``keeps_session(pinned, chosen, ...)`` decides whether a session's pin overrides the choice.

A policy with ``prices_tiers`` also takes ``host_matches`` (replica id -> leading blocks of the prompt
in its host-memory tier, ``PrefixIndex.host``) when any replica has announced such a tier; the
router never passes it otherwise, so without tiers every policy decides exactly as before.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence


class NoReplicaError(RuntimeError):
    """No candidate replica was given to a policy (every replica is unhealthy or none exists)."""


class Policy:
    """Base class: holds the options every policy accepts."""

    name = "base"
    prices_tiers = False
    """Whether ``choose`` takes ``host_matches`` (host-tier blocks priced by their load-back)."""

    def __init__(self, block_size: int = 16, seed: int | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        """Tokens per block (to turn matched blocks into tokens)."""
        self.rng = random.Random(seed)
        """Random source of sampling policies; seeded for reproducible simulations."""

    def choose(
        self,
        request_keys: Sequence[int],
        matches: Mapping[Hashable, int],
        loads: Mapping[Hashable, object],
        num_prompt_tokens: int | None = None,
    ) -> Hashable:
        raise NotImplementedError

    def keeps_session(self, pinned: Hashable, chosen: Hashable, request_keys: Sequence[int],
                      matches: Mapping[Hashable, int], loads: Mapping[Hashable, object],
                      num_prompt_tokens: int | None = None) -> bool:
        """Whether a request of a session pinned to ``pinned`` stays there although ``choose``
        picked ``chosen`` (router/routing/session.py). Baselines know no cost: the pin always holds."""
        return True

    @staticmethod
    def _check(loads: Mapping) -> None:
        if not loads:
            raise NoReplicaError("no healthy replica to route to; start or register a replica")
