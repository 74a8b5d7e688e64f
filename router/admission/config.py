"""``AdmissionConfig``: the router's ``admission`` section (``router.admission.*``, ``--admission-*`` flags)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmesh.router.admission.rate_limit import TokenRate
from kvmesh.router.admission.tenants import DEFAULT_TENANT, PRIORITY_LIMIT, Tenant, Tenants, load_keys_file


@dataclass(slots=True)
class AdmissionConfig:
    """Admission in the router (router/admission): a bounded queue per model by priority then fair share,
    tenants' token-rate limits, TTFT deadlines, 429s with a reason."""

    enabled: bool = True
    """Queue, limit and shed in the router; False: every request goes straight to a replica."""
    keys_file: str | None = None
    """YAML/JSON file of API keys, each with its tenant, default priority and token-rate limit (README "Overload");
    its keys are accepted besides api_key. Each key is its tenant; the router's own api_key is ``shared_tenant``."""
    shared_tenant: str = DEFAULT_TENANT
    """The tenant of every request with the router's own api_key (or, on a router without one, no key): one
    tenant, whatever the body's ``user`` says."""
    shared_priority: int = 0
    """The default priority of the shared tenant's requests (lower is served first)."""
    shared_min_priority: int = 0
    """The best (lowest) priority a shared-key request may ask for (header or body); a better one is raised to it."""
    user_tenants: bool = False
    """A request's ``user`` names a sub-tenant of its key's tenant, ``<tenant>/<user>``: its own fair share, the key's
    priorities, and tokens taken from the key's bucket. False: ``user`` names no tenant (the key alone says who it
    is)."""
    max_users_per_key: int = 16
    """With user_tenants, the sub-tenants one key's tenant may have; further ``user`` names share ``<tenant>/other``."""
    max_queued: int = 1024
    """Requests one model's queue holds (all router processes of the host together); past it, 429 queue full."""
    admit_ttft_s: float = 0.5
    """A request leaves the router's queue for a replica whose predicted TTFT is within this many seconds
    (without a prediction: a replica with a free slot); keeps replicas' own queues short."""
    ttft_deadline_s: dict[int, float] = field(default_factory=dict)
    """TTFT deadline in seconds per priority class, e.g. {0: 1.0, 10: 30.0}: a priority's class is the largest
    key at or below it; a request that cannot meet its deadline gets 429. Empty: no deadline but the header's."""
    ttft_target_s: float | None = None
    """TTFT target in seconds of a request whose class has no deadline: what ``cache_aware_tokens``' ``tail_knee``
    steers the queue's tail to (a target, not a deadline: nothing is shed for it). None: 1 s (``kvmesh sim``: the
    workload's own target, the one its goodput counts)."""
    tokens_per_s: float | None = None
    """Token-rate limit (prompt + output tokens per second) of each tenant the keys file gives none; None: no limit."""
    burst_s: float = 10.0
    """A token bucket holds this many seconds of its rate unless the keys file says burst_tokens."""
    fleet_sync_s: float = 0.1
    """Seconds between a router's exchanges of its tenants' token totals with the other routers, through the database
    of ``router.responses`` (router/control/quota_sync.py): a tenant's limit is the fleet's. 0: each router's own."""
    fleet_stale_s: float = 2.0
    """Without a successful exchange for this long (the database slow or down), each router refills a tenant's
    bucket at its rate divided by the routers alive at the last exchange (the fleet stays within the limit)."""
    fair_share_half_life_s: float = 60.0
    """Half-life of a tenant's token usage in fair share (tokens used this long ago count half)."""
    max_tenants: int = 1024
    """Tenants tracked for fair share, limits and metrics; past it, the newest share one slot (and, in metrics,
    the least busy half is folded into ``*other*``)."""
    metric_tenants: int = 32
    """Tenants /metrics names: the ones with the most tokens keep their names, the rest are summed under
    ``*other*`` (so /metrics stays small however many tenants try)."""
    slots_ttl_s: float = 30.0
    """Without a predicted TTFT, a replica's slots are what it ran while it reported waiting requests; trusted this
    long, then learned again (its /load's waiting requests)."""
    lookahead: int = 8
    """Waiters the queue looks at each time room may have changed: when the head must wait for its replica, the
    first one after it that the gate lets go and that goes to another replica (none a waiter ahead of it waits for)
    goes first, so a busy replica holds back only the requests routed to it. 1: strictly in order."""
    hold_while_idle: bool = False
    """Whether the gate holds a request for its busy replica (a predicted wait past ``admit_ttft_s``, or no free
    slot) while another replica that serves it is idle (nothing in flight or waiting there). False: it holds none
    then, the fleet has room; the request goes where its predicted TTFT is sooner, its busy replica's queue or the
    idle replica the policy prefers among the idle ones (a policy that predicts none: the idle one). Waiting in the
    router would add the time until room is seen, and hide the request from the prefix index meanwhile. True: it
    waits for the replica the policy chose."""
    recheck_interval_s: float = 0.02
    """Seconds between looks at the replicas' room while requests wait (also woken by each request's end)."""

    def __post_init__(self) -> None:
        if self.max_queued < 0:
            raise ValueError(f"admission max_queued must be >= 0 (0: never wait), got {self.max_queued}")
        if self.lookahead < 1:
            raise ValueError(f"admission lookahead must be >= 1 waiter (1: strictly in order), got {self.lookahead}")
        for name, value in (("admit_ttft_s", self.admit_ttft_s), ("burst_s", self.burst_s),
                            ("fair_share_half_life_s", self.fair_share_half_life_s),
                            ("recheck_interval_s", self.recheck_interval_s), ("slots_ttl_s", self.slots_ttl_s)):
            if not value > 0:
                raise ValueError(f"admission {name} must be positive seconds, got {value}")
        if not self.fleet_sync_s >= 0 or not self.fleet_stale_s > self.fleet_sync_s:
            raise ValueError(f"admission fleet_sync_s must be >= 0 seconds (0: each router's own limits) and "
                             f"fleet_stale_s above it; got {self.fleet_sync_s}, {self.fleet_stale_s}")
        if self.tokens_per_s is not None and not self.tokens_per_s > 0:
            raise ValueError(f"admission tokens_per_s must be positive (None: no limit), got {self.tokens_per_s}")
        if self.metric_tenants < 0:
            raise ValueError(f"admission metric_tenants must be >= 0 (0: every tenant under *other*), got "
                             f"{self.metric_tenants}")
        if self.max_tenants < 2:
            raise ValueError(f"admission max_tenants must be >= 2, got {self.max_tenants}")
        self._check_shared()
        if self.ttft_target_s is not None and not 0 < self.ttft_target_s < math.inf:
            raise ValueError(f"admission ttft_target_s must be finite seconds > 0 (or unset), got {self.ttft_target_s}")
        for priority, seconds in self.ttft_deadline_s.items():
            if not isinstance(priority, int) or not seconds > 0:
                raise ValueError(f"admission ttft_deadline_s maps a priority (int) to positive seconds; got "
                                 f"{priority!r}: {seconds!r}")

    def _check_shared(self) -> None:
        if not self.shared_tenant or "/" in self.shared_tenant:
            raise ValueError(f"admission shared_tenant must be a name without '/', got {self.shared_tenant!r}")
        for name, value in (("shared_priority", self.shared_priority),
                            ("shared_min_priority", self.shared_min_priority)):
            if abs(value) > PRIORITY_LIMIT:
                raise ValueError(f"admission {name} must be in [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}], got {value}")
        if self.shared_min_priority > self.shared_priority:
            raise ValueError(f"admission shared_min_priority {self.shared_min_priority} is worse (higher) than "
                             f"shared_priority {self.shared_priority}; lower it or raise shared_priority")
        if self.max_users_per_key < 1:
            raise ValueError(f"admission max_users_per_key must be >= 1, got {self.max_users_per_key}")

    def tenants(self, admin_key: str | None = None) -> Tenants:
        """The tenants: the keys file's (read now; a ValueError names what is wrong) and the shared one.
        A key of the file that is ``admin_key`` is refused (tenants never hold the admin key)."""
        limit = self.default_limit()
        shared = Tenant(self.shared_tenant, self.shared_priority, limit, self.shared_min_priority)
        users = self.max_users_per_key if self.user_tenants else 0
        if self.keys_file is None:
            return Tenants((), limit, self.burst_s, shared, users)
        tenants = load_keys_file(self.keys_file, limit, self.burst_s, shared, users)
        if tenants.for_key(admin_key) is not None:
            raise ValueError(f"admission keys file {self.keys_file} lists the admin key: tenants never hold it")
        return tenants

    def default_limit(self) -> TokenRate | None:
        """The limit of tenants without their own."""
        return None if self.tokens_per_s is None else TokenRate(self.tokens_per_s, self.tokens_per_s * self.burst_s)

    def target_s(self) -> float:
        """``ttft_target_s``, or 1 s where unset."""
        return 1.0 if self.ttft_target_s is None else self.ttft_target_s

    def class_deadline_s(self, priority: int) -> float | None:
        """The TTFT deadline of ``priority``'s class (None: none)."""
        classes = self.ttft_deadline_s
        if not classes:
            return None
        at_or_below = [p for p in classes if p <= priority]
        return classes[max(at_or_below) if at_or_below else min(classes)]
