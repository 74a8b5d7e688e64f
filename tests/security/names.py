"""The names and numbers the security tests assume of the fixed code, in one place.

The fixes land on other branches; where a test depends on a detail they choose (a status code, a metric
name, where ``kvmesh serve`` keeps the internal key), it reads it from here, so aligning the suite after
the merge is an edit of this file alone. Every assertion on a refusal checks the class (4xx, not 2xx)
and the absence of any effect; the exact codes below are only named in the failure messages.
"""

from __future__ import annotations

INTERNAL_KEY_ENV = "KVMESH_INTERNAL_KEY"
"""The internal key's environment variable (router and replica server: ``internal_key``)."""
REPLICA_ID_HEADER = "x-kvmesh-replica-id"
"""The header a puller names itself with on its /kv/* calls (peer identity for the lease caps)."""
PEERS_PATH = "/kv/peers"
"""Where the router registers a replica's peers (internal key only)."""
KV_PATHS = ("/kv/handshake", "/kv/lease", "/kv/release")
"""The holder's KV plane routes (plus ``PEERS_PATH`` once it exists)."""

NO_KEY_STATUS = 401
"""/kv/* without a key (or a wrong one)."""
TENANT_KEY_STATUS = 403
"""/kv/* with a tenant's API key (the KV plane is the cluster's own)."""

LEASES_ACTIVE = "kvmesh_kv_transfer_leases_active"
"""Replica gauge: leases it holds blocks for (replica/server/kv_metrics.py)."""
PULLS_TOTAL = "kvmesh_kv_transfer_pulls_total"
"""Replica counter of pulls it tried, by ``outcome`` (ok|failed|skipped)."""
PULLED_TOKENS_TOTAL = "kvmesh_kv_transfer_pulled_tokens_total"
"""Replica counter of prompt tokens pulled from peers."""
PULLED_TOKENS_HEADER = "x-kvmesh-kv-pulled-tokens"
"""A completion answer's header: tokens its replica pulled (0 without a pull)."""

FLOOD_LEASES = 200
"""Leases a flood asks one holder for with the internal key: more than any cap lets one peer hold
(kv_transfer.max_leases_per_peer 64, max_leases 256, max_leased_blocks_fraction 0.5)."""
LONGEST_LEASE_S = 300.0
"""A granted lease must expire within this many seconds (asked: 3,600 s, the old cap; kv_transfer.max_lease_ttl_s
clamps it to 60 s)."""
OVERSIZED_LEASE_TOKENS = 2_000_000
"""Token ids in an oversized /kv/lease body (about 14 MiB of JSON; a replica must refuse it before decoding)."""
NORMAL_WAIT_S = 5.0
"""A tenant's short request answered within this many seconds counts as not kept waiting (0.02 s normally)."""
STREAM_GAP_S = 0.45
"""The longest pause between a stream's chunks, beyond the longest the same stream shows alone, that counts as not
stalled (alone: 0.01 s on the idle 2-core test box; one pause of 0.31 s seen under four other test processes;
under the old bodies, which a replica decoded before refusing: 0.55 to 3.5 s)."""


def internal_key(cluster) -> str:
    """The cluster-internal key ``kvmesh serve`` generated for this run, read from the router's config as serve
    builds it."""
    return cluster.router_config().internal_key
