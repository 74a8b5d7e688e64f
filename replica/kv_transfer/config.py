"""The ``kv_transfer`` config section of a replica (torch-free: the CLI derives flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

TRANSPORTS = ("nixl", "local")
"""The transports agent.py's registry knows (``nixl``: NIXL over UCX; ``local``: in-process copies)."""


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """How a replica moves KV blocks to and from its peers (P/D splits and peer pulls)."""

    enabled: bool = field(default=False, metadata={"flag": "--kv-transfer"})
    """Create a transfer agent at start-up and serve /kv/handshake, /kv/lease, /kv/release and kv_transfer_params."""
    transport: str = field(default="nixl", metadata={"flag": "--kv-transfer-transport"})
    """``nixl`` (NIXL over UCX: across processes and machines) or ``local`` (in-process copies, for tests)."""
    lease_ttl_s: float = field(default=30.0, metadata={"flag": "--kv-transfer-lease-ttl-s"})
    """Seconds a lease holds its blocks on this replica when the puller never releases it."""
    max_lease_ttl_s: float = field(default=60.0, metadata={"flag": "--kv-transfer-max-lease-ttl-s"})
    """Longest lease a peer may ask for (/kv/lease's ``ttl_s``); a longer ask is clamped to it."""
    max_leases_per_peer: int = field(default=64, metadata={"flag": "--kv-transfer-max-leases-per-peer"})
    """Live leases one peer (its x-kvmesh-replica-id, else its address) may hold here; past it /kv/lease is a 429."""
    max_leases: int = field(default=256, metadata={"flag": "--kv-transfer-max-leases"})
    """Live leases this replica holds for all peers together (prefill handles included); past it a 429."""
    max_leased_blocks_fraction: float = field(default=0.5,
                                              metadata={"flag": "--kv-transfer-max-leased-blocks-fraction"})
    """Fraction of the KV blocks (and of the host tier's) that leases may hold together; past it a 429."""
    peers: tuple[str, ...] = field(default=(), metadata={"flag": "--kv-peer"})
    """Base URLs this replica may pull from besides the router's registered set (POST /kv/peers); repeatable."""
    timeout_s: float = field(default=10.0, metadata={"flag": "--kv-transfer-timeout-s"})
    """A transfer (or a peer's /kv/* answer) not done after this many seconds fails; the prompt is computed."""
    poll_interval_s: float = field(default=0.0005, metadata={"flag": "--kv-transfer-poll-interval-s"})
    """Seconds between completion checks while waiting on a transfer."""
    progress_delay_us: int = field(default=1000, metadata={"flag": "--kv-transfer-progress-delay-us"})
    """Microseconds nixl's UCX progress thread sleeps between wake-ups when no event comes (it wakes at once on one);
    0 busy-polls a CPU core per agent (replica and TP rank), idle or not."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"kv transfer transport {self.transport!r} is unknown; choose one of "
                             f"{', '.join(TRANSPORTS)}")
        if self.timeout_s <= 0 or self.poll_interval_s <= 0 or self.lease_ttl_s <= 0:
            raise ValueError(f"kv transfer timeout_s ({self.timeout_s}), poll_interval_s ({self.poll_interval_s}) "
                             f"and lease_ttl_s ({self.lease_ttl_s}) must be positive")
        if self.lease_ttl_s > self.max_lease_ttl_s:
            raise ValueError(f"kv transfer lease_ttl_s ({self.lease_ttl_s}) is above max_lease_ttl_s "
                             f"({self.max_lease_ttl_s}); lower it or raise the cap")
        if self.max_leases_per_peer < 1 or self.max_leases < 1:
            raise ValueError(f"kv transfer max_leases_per_peer ({self.max_leases_per_peer}) and max_leases "
                             f"({self.max_leases}) must be at least 1")
        if not 0 < self.max_leased_blocks_fraction <= 1:
            raise ValueError(f"kv transfer max_leased_blocks_fraction ({self.max_leased_blocks_fraction}) must be "
                             "in (0, 1]")
        for url in self.peers:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"kv transfer peer {url!r} is not an http(s)://host:port URL")
        if self.progress_delay_us < 0:
            raise ValueError(f"kv transfer progress_delay_us ({self.progress_delay_us}) must be 0 or more")
