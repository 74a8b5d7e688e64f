"""Configuration of one simulation run (validated at the edge, trusted inside)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmesh.cluster.sim.cost_model import CostModel

ROUTER_SPREADS = ("round_robin", "random")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """N simulated replicas, each a real ``KVCacheManager`` behind a cost model."""

    num_replicas: int = 16
    """Simulated replicas behind the router."""
    block_size: int = 512
    """Tokens per KV block of a simulated replica. 512 = one Mooncake ``hash_id`` per block: a
    real engine would use 16, but 512 keeps the pools, events and index 32x smaller at scale and
    gives the same hit rates on hash_id traces (prefixes are shared in whole 512-token blocks)."""
    blocks_per_replica: int | None = None
    """KV blocks per replica (the null block comes on top). None: ``capacity_fraction`` of the
    trace's working set (distinct blocks), split evenly across replicas."""
    capacity_fraction: float = 0.25
    """Total cluster KV capacity as a fraction of the trace's working set (when ``blocks_per_replica`` is None)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one engine step (prefill chunks + one token per decoding sequence)."""
    max_num_seqs: int = 256
    """Most sequences running at once on a replica."""
    event_delay_s: float = 0.0
    """Simulated delay between a cache change on a replica and the router applying its event."""
    predict_ttl_s: float = 2.0
    """The index's prediction window (``PrefixIndex.predict_ttl_s``, router default): how long a
    routed request's blocks count as held before events confirm them; 0 disables predictions."""
    time_scale: float = 1.0
    """Multiplies trace arrival times: 0.25 replays the trace 4x faster (4x the request rate)."""
    vocab_size: int = 256
    """Token ids generated per hash id are drawn from [3, vocab_size). 256 keeps every id a shared
    small int in CPython (8 bytes per token in the pools' token lists instead of 36); 253**512
    possible blocks still never collide, so prefixes are shared exactly as the trace says."""
    seed: int = 0
    """Seed for generated token ids and for policies that draw random numbers."""
    num_routers: int = 1
    """Independent routers (each its own ``KVRouter``: index, predictions, load view, sessions)
    with the requests spread over them, as ``kvmesh router --workers N`` runs them."""
    router_spread: str = "round_robin"
    """How requests are spread over the routers: ``round_robin`` or ``random``."""
    load_poll_s: float = 0.0
    """Seconds between a router's polls of every replica's ``/load`` (running, waiting, queued
    prefill tokens); 0 = no polling (a router sees only its own in-flight counts)."""
    share_predictions: bool = False
    """With several routers: each routed request's blocks are also predicted on its replica in
    every other router's index (what routers gain by telling each other their decisions)."""
    share_loads: bool = False
    """With several routers: every router counts every router's dispatches, first tokens and
    finishes (in-flight counts shared, e.g. through shared memory between router workers)."""
    share_sessions: bool = False
    """With several routers: a session pin made by one router is made in all (one shared session
    table); without it each router pins only the turns it routed, and its pins go stale."""
    use_sessions: bool = False
    """Pass the trace's session ids (multi-turn conversations) to ``KVRouter.route`` (session affinity)."""
    session_ttl_s: float = 600.0
    """Seconds a session pin lives after its last request (``SessionConfig.ttl_s``)."""
    cost: CostModel = field(default_factory=CostModel)
    """Step-time model (H100-class defaults for an 8B model)."""
    policy_kwargs: dict = field(default_factory=dict)
    """Keyword arguments for every policy built by ``get_policy(name, **policy_kwargs)``
    (a key a policy does not take is dropped for it)."""

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1 token, got {self.block_size}")
        if self.blocks_per_replica is not None and self.blocks_per_replica < 1:
            raise ValueError(f"blocks_per_replica must be >= 1, got {self.blocks_per_replica}")
        if not self.capacity_fraction > 0:
            raise ValueError(f"capacity_fraction must be > 0, got {self.capacity_fraction}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1, got "
                             f"{self.max_num_batched_tokens} and {self.max_num_seqs}")
        if self.event_delay_s < 0:
            raise ValueError(f"event_delay_s must be >= 0, got {self.event_delay_s}")
        if self.predict_ttl_s < 0:
            raise ValueError(f"predict_ttl_s must be >= 0, got {self.predict_ttl_s}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.num_routers < 1:
            raise ValueError(f"num_routers must be >= 1, got {self.num_routers}")
        if self.router_spread not in ROUTER_SPREADS:
            raise ValueError(f"router_spread must be one of {ROUTER_SPREADS}, got {self.router_spread!r}")
        if self.load_poll_s < 0:
            raise ValueError(f"load_poll_s must be >= 0 (0 = no polling), got {self.load_poll_s}")
        if not self.session_ttl_s > 0:
            raise ValueError(f"session_ttl_s must be > 0, got {self.session_ttl_s}")
        if self.vocab_size < 4:
            raise ValueError(f"vocab_size must be >= 4, got {self.vocab_size}")


def miniature(config: SimConfig, factor: int) -> SimConfig:
    """The same simulation with every token count divided by ``factor`` and every per-token cost
    multiplied by it: blocks of ``block_size / factor`` tokens (still one per hash id), a step
    budget ``factor`` times smaller. Model time, hit rates and queueing stay the same to within
    rounding, while hashing and token generation get ``factor`` times cheaper (quick cuts, tests).
    """
    from dataclasses import replace

    if factor < 1 or config.block_size % factor:
        raise ValueError(f"miniature factor {factor} must divide block_size {config.block_size}")
    c = config.cost
    cost = replace(c, prefill_s_per_token=c.prefill_s_per_token * factor,
                   decode_s_per_context_token=c.decode_s_per_context_token * factor)
    return replace(config, block_size=config.block_size // factor, cost=cost,
                   max_num_batched_tokens=max(1, config.max_num_batched_tokens // factor))
