"""Who may take a place in a full queue: each tenant's share of a model's ``max_queued`` places.

The bound is the model's, but its places are shared: a tenant under its share that finds the queue full takes the
place of the newest waiter of the tenant most over its share; a tenant at or over its share is refused itself. So
a tenant that retries the moment it is refused gains nothing over one that waits: once the queue is full it
holds its share and no more, whoever came first.

Shares are max_queued split evenly between the tenants with requests waiting (the arriving one counted), in two
levels as tenants are named (tenants.py): first between API keys' tenants, then, within a key's tenant, between
its ``user`` sub-tenants (``<tenant>/<user>``). So naming many users under one key wins that key no more places
than one user has::

    max_queued 8; waiting: team/a 5, team/b 3 (key "team"); light arrives (key "light", none waiting)
      keys: team, light -> 4 places each; team holds 8 (over by 4), light 0 (under): light takes team/a's newest
      (team/a is over team's per-user share of 2 by 3, team/b by 1)

Most over = the most waiting above the share; ties go to the tenant that has used more (fair share's usage,
fair_share.py), then by name (the same answer in every router process).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class QueuePlace:
    """An arrival's standing in a full queue."""

    waiting: int
    """Its tenant's requests waiting now."""
    share: float
    """Its tenant's share of the queue's places (two levels: its key's, split between the key's users)."""
    displace: str | None
    """The tenant whose newest waiter gives its place to the arrival (None: the arrival is refused)."""


def key_tenant(tenant: str) -> str:
    """The key's tenant a (sub-)tenant belongs to: ``team/a`` -> ``team`` (tenants.py names sub-tenants so)."""
    return tenant.partition("/")[0]


def place_in_full_queue(waiting: Mapping[str, int], tenant: str, max_queued: int,
                        usage: Callable[[str], float]) -> QueuePlace:
    """Where an arrival of ``tenant`` stands in a full queue: ``waiting`` maps each tenant to its waiting requests
    (every router process's), ``usage(tenant)`` is its fair-share usage now (ties)."""
    groups = _groups(waiting, tenant)
    mine = groups[key_tenant(tenant)]
    group_share = max_queued / len(groups)
    share = group_share / len(mine)
    own = mine[tenant]
    if own >= share:
        return QueuePlace(own, share, None)
    if sum(mine.values()) < group_share:  # its key is under its share: the key most over gives the place
        over = _most_over({g: sum(m.values()) for g, m in groups.items()}, group_share,
                          lambda g: sum(usage(t) for t in groups[g]))
        if over is None:
            return QueuePlace(own, share, None)
        members = groups[over]
        victim = _most_over(members, group_share / len(members), usage)
    else:  # its key holds its share, unevenly: the key's user most over gives the place
        victim = _most_over(mine, share, usage)
    return QueuePlace(own, share, victim)


def share_of(waiting: Mapping[str, int], tenant: str, max_queued: int) -> float:
    """``tenant``'s share of the queue's places, with ``waiting`` (it counted whether or not it waits)."""
    groups = _groups(waiting, tenant)
    return max_queued / len(groups) / len(groups[key_tenant(tenant)])


def _groups(waiting: Mapping[str, int], tenant: str) -> dict[str, dict[str, int]]:
    """Key's tenant -> its (sub-)tenants with requests waiting -> how many; ``tenant`` is in, with 0 if none."""
    groups: dict[str, dict[str, int]] = {}
    for t, n in waiting.items():
        if n > 0:
            groups.setdefault(key_tenant(t), {})[t] = n
    groups.setdefault(key_tenant(tenant), {}).setdefault(tenant, 0)
    return groups


def _most_over(counts: Mapping[str, int], share: float, usage: Callable[[str], float]) -> str | None:
    """The name with the most above ``share`` (ties: more usage, then the greater name); None: none is over."""
    over = [(n, usage(name), name) for name, n in counts.items() if n > share]
    return max(over)[2] if over else None
