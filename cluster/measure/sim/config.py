"""The simulator's configuration: the step-time cost model and one run's settings.

Model time for a simulated replica is ``CostModel`` (replica/emulate/cost_model.py), the same step-time model the
emulated replica waits out (``kvmesh replica --emulate h100-8b``).

Configuration of one simulation run (validated at the edge, trusted inside).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvmesh.cluster.measure.sim.lora_config import SimLoRAConfig
from kvmesh.cluster.measure.sim.policy_kwargs import PolicyArgument, check_policy_kwargs
from kvmesh.cluster.measure.workloads.tenants import parse_tenant_mix
from kvmesh.replica.config import EngineConfig, parse_size
from kvmesh.replica.emulate.cost_model import CostModel
from kvmesh.router.config import RouterConfig

ROUTER_SPREADS = ("round_robin", "random")
PD_PREFILL_PICKS = ("least_loaded", "policy")

SIMULATED_MODEL = "simulated"
"""``engine.model`` of a simulated replica: no model is loaded, the cost model stands in for it."""


def sim_engine(block_size: int = 512, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> EngineConfig:
    """The engine section of a simulated replica: the scheduler's budgets and the block size are the ones it
    reads. 512-token blocks = one Mooncake ``hash_id`` per block: a real engine would use 16, but 512 keeps the
    pools, events and index 32x smaller at scale and gives the same hit rates on hash_id traces (prefixes are
    shared in whole 512-token blocks)."""
    return EngineConfig(model=SIMULATED_MODEL, block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                        max_num_seqs=max_num_seqs)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """N simulated replicas, each a real ``KVCacheManager`` behind a cost model."""

    num_replicas: int = 16
    """Simulated replicas behind the router that decode (role ``both``, or ``decode`` next to prefill replicas)."""
    num_prefill_replicas: int = 0
    """Prefill-only replicas next to ``num_replicas`` (as ``kvmesh serve --num-prefill-replicas``): a prompt
    whose uncached suffix on its decode replica is at least the router's ``pd_min_uncached_tokens`` is computed
    on one and its KV moved to the decode replica (sim/transfer.py)."""
    pd_prefill_pick: str = "least_loaded"
    """How a split picks its prefill replica: ``least_loaded`` (the router's contract: smallest prefill backlog)
    or ``policy`` (the routing policy compared, over the prefill replicas: cache-aware for cache_aware)."""
    peer_pulls: bool = False
    """A replica the router sends away from the prefix holder pulls the holder's extra blocks when that costs
    fewer seconds than computing them (the router's pricing rule, sim/transfer.py)."""
    kv_transfer_bytes_per_s: float = 1.8e9
    """Bandwidth of a KV transfer between replicas. Default: BENCHMARKS.md, "KV transfer between
    replicas": nixl over UCX between two processes on this machine's host memory, 256 scattered blocks (a GPU
    fleet with RDMA is 10x+ faster)."""
    kv_transfer_latency_s: float = 0.00018
    """Fixed seconds per transfer (BENCHMARKS.md, "KV transfer between replicas": a one-block read,
    0.16-0.20 ms)."""
    kv_bytes_per_token: int = 131_072
    """KV bytes of one token in the model's dtype: 128 KiB for the cost model's 8B Llama-3 (32 layers x 8 KV heads x
    128 x K,V x bf16); an FP8 cache (engine.kv_cache_dtype) holds and moves half (``cache_bytes_per_token``)."""
    kv_cache_memory_per_replica: int | str | None = None
    """KV cache per replica, bytes or a size such as "40GiB": ``blocks_per_replica`` becomes what it holds at
    ``cache_bytes_per_token`` (so an FP8 cache holds twice the blocks); None: ``blocks_per_replica``."""
    engine: EngineConfig = field(default_factory=sim_engine)
    """The replicas' engine section; a simulated replica reads its block_size, max_num_batched_tokens and
    max_num_seqs (``sim_engine``)."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """The router's section; the simulated router reads predict_ttl_s, predict_hold_s, its sessions and transfers
    sections (pd_min_uncached_tokens, pd_max_prefill_backlog_tokens, pd_ttft_slack_s, pd_stall_weight,
    peer_pull_overhead_s); its block size is the engine's, its policy the one compared."""
    blocks_per_replica: int | None = None
    """KV blocks per replica (the null block comes on top). None: ``capacity_fraction`` of the
    trace's working set (distinct blocks), split evenly across replicas."""
    capacity_fraction: float = 0.25
    """Total cluster KV capacity as a fraction of the trace's working set (when ``blocks_per_replica`` is None)."""
    offload_blocks_per_replica: int | None = None
    """Host-tier KV blocks per replica (kvcache/host_tier.py). None: ``offload_capacity_fraction`` of the
    working set, split evenly across replicas."""
    offload_capacity_fraction: float = 0.0
    """Total host-tier capacity as a fraction of the trace's working set (0 = no tier); each run is then
    compared with the same run without the tier (unless ``offload_compare`` is off)."""
    offload_compare: bool = True
    """With a host tier: also run each policy without it (labels /no-tier and /host-tier); off: the tier's runs only."""
    event_delay_s: float = 0.0
    """Simulated delay between a cache change on a replica and the router applying its event."""
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
    published_loads: bool = False
    """Every replica publishes its load (running, waiting, queued prefill tokens, and per router the requests it
    accepted) when it accepts a request, and when a step changed it at most every ``load_publish_interval_s``;
    every router takes it
    ``load_publish_lag_s`` later, adding only its own requests the replica had not counted yet (events/load.py;
    no shared memory)."""
    load_publish_interval_s: float = 0.005
    """Least seconds between two of a replica's published loads caused by its steps: a step's change within it is
    published when it ends (a request accepted is published at once)."""
    load_publish_lag_s: float = 0.001
    """Seconds from a replica's step end to its published load reaching the routers (send, network, apply)."""
    router_sync: bool = False
    """With several routers and ``published_loads``: each router tells the others of every request it sends, as
    ``router.sync`` does (router/control/router_sync.py): ``sync_lag_s`` later they count its booking on that replica
    until the replica's published load acknowledges it, and predict its blocks there."""
    sync_lag_s: float = 0.001
    """Seconds from a router's choice to the others applying it (publish, network, their loop's turn)."""
    router_turn_s: float | None = None
    """With ``router_sync``: the routers take turns of this many seconds to decide (router/control/turns.py), router
    k of N at the start of the turns numbered k mod N, so no two decide within a turn of each other and each has been
    told the others' choices (more than ``sync_lag_s``); a request waits for its router's next turn, the wait counted
    in its TTFT. None: the router's own (``router.sync.turn_s``); 0: every router decides as a request arrives."""
    share_sessions: bool = False
    """With several routers: a session pin made by one router is made in all (one shared session
    table); without it each router pins only the turns it routed, and its pins go stale."""
    use_sessions: bool = False
    """Pass the trace's session ids (multi-turn conversations) to ``KVRouter.route`` (session affinity)."""
    cost: CostModel = field(default_factory=CostModel)
    """Step-time model (H100-class defaults for an 8B model)."""
    policy_kwargs: dict[str, PolicyArgument] = field(default_factory=dict)
    """Knobs of every policy compared (``policies.policy_config``; a knob a policy does not take is left out
    for it, one no policy takes is an error)."""
    lora: SimLoRAConfig = field(default_factory=SimLoRAConfig, metadata={"prefix": ""})
    """LoRA adapters: the replicas' slots (max_loras), an adapter's size and load rate, adapter affinity
    (sim/lora.py)."""
    tenants: str = ""
    """Tenants, priorities and latency targets over the workload (workloads/tenants.py): a preset ("overload") or
    NAME:SHARE[:PRIORITY[:TTFT_S[:ITL_S]]],...; the report then gives goodput per tenant and priority. "": one
    anonymous tenant without targets."""
    admission: bool = False
    """Requests pass the router's admission (router/admission/, its ``router.admission`` section) before they are
    routed, in simulated time (sim/admission.py): they wait in the router or are shed (429) with a reason."""
    admission_pricing: str = "queue"
    """How admission prices the head of its queue: "queue" = a predicted TTFT from the prompt tokens queued on the
    least-queued replica at its prefill rate (a stand-in for cache_aware's ``predicted_ttft_s``, which the HTTP
    router's gate uses: no cache hits), so a head that can no longer meet its deadline is shed instead of sent to
    miss it; "slots" = not priced (it goes on when a replica has a free slot, as the HTTP gate does under a
    policy that does not price; such a head is shed only when its deadline passes).
    BENCHMARKS.md, "Overload in the simulator"."""

    @property
    def turn_s(self) -> float:
        """The turns the simulated routers take (``router_turn_s``, else the router's own with ``router_sync``; 0
        without the sync stream or with admission, which routes when it lets a request go)."""
        if not self.router_sync or self.admission:
            return 0.0
        return self.router.sync.turn_s if self.router_turn_s is None else self.router_turn_s

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1 (replicas that decode), got {self.num_replicas}")
        if self.num_prefill_replicas < 0:
            raise ValueError(f"num_prefill_replicas must be >= 0 (0 = no prefill/decode split), "
                             f"got {self.num_prefill_replicas}")
        if self.pd_prefill_pick not in PD_PREFILL_PICKS:
            raise ValueError(f"pd_prefill_pick must be one of {', '.join(PD_PREFILL_PICKS)}; got "
                             f"{self.pd_prefill_pick!r}")
        if not self.kv_transfer_bytes_per_s > 0:
            raise ValueError(f"kv_transfer_bytes_per_s must be > 0 bytes per second, "
                             f"got {self.kv_transfer_bytes_per_s}")
        if not self.kv_transfer_latency_s >= 0:
            raise ValueError(f"kv_transfer_latency_s must be >= 0 seconds, got {self.kv_transfer_latency_s}")
        object.__setattr__(self, "kv_cache_memory_per_replica",
                           parse_size(self.kv_cache_memory_per_replica, "kv_cache_memory_per_replica"))
        if self.kv_cache_memory_per_replica is not None and self.blocks_per_replica is not None:
            raise ValueError("set kv_cache_memory_per_replica or blocks_per_replica, not both")
        if self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}")
        if self.router_sync and not self.published_loads:
            raise ValueError("router_sync counts another router's booking until the replica's published load "
                             "acknowledges it: it needs published_loads")
        if not self.sync_lag_s >= 0:
            raise ValueError(f"sync_lag_s must be >= 0 seconds, got {self.sync_lag_s}")
        if self.router_turn_s is not None and not self.router_turn_s >= 0:
            raise ValueError(f"router_turn_s must be >= 0 seconds, got {self.router_turn_s}")
        if self.router_turn_s and (not self.router_sync or self.admission or self.router_turn_s <= self.sync_lag_s):
            raise ValueError("router_turn_s gives the routers turns to decide in, each told the others' choices before "
                             "its turn: it needs router_sync, a turn longer than sync_lag_s, and is not modelled with "
                             "admission")
        if self.share_loads and self.published_loads:
            raise ValueError("share_loads and published_loads together count another router's request twice (once "
                             "shared, once as the replica publishes it, the phantom booking never acknowledged): "
                             "choose one")
        if self.router.block_size != self.engine.block_size:  # the router hashes the replicas' blocks
            object.__setattr__(self, "router", replace(self.router, block_size=self.engine.block_size))
        if self.blocks_per_replica is not None and self.blocks_per_replica < 1:
            raise ValueError(f"blocks_per_replica must be >= 1, got {self.blocks_per_replica}")
        if self.offload_blocks_per_replica is not None and self.offload_blocks_per_replica < 0:
            raise ValueError(f"offload_blocks_per_replica must be >= 0, got {self.offload_blocks_per_replica}")
        if not self.offload_capacity_fraction >= 0:
            raise ValueError(f"offload_capacity_fraction must be >= 0 (0 = no host tier), got "
                             f"{self.offload_capacity_fraction}")
        if not self.capacity_fraction > 0:
            raise ValueError(f"capacity_fraction must be > 0, got {self.capacity_fraction}")
        if self.event_delay_s < 0:
            raise ValueError(f"event_delay_s must be >= 0, got {self.event_delay_s}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.num_routers < 1:
            raise ValueError(f"num_routers must be >= 1, got {self.num_routers}")
        if self.router_spread not in ROUTER_SPREADS:
            raise ValueError(f"router_spread must be one of {ROUTER_SPREADS}, got {self.router_spread!r}")
        if self.load_publish_lag_s < 0 or self.load_publish_interval_s < 0:
            raise ValueError(f"load_publish_lag_s and load_publish_interval_s must be >= 0 seconds, got "
                             f"{self.load_publish_lag_s} and {self.load_publish_interval_s}")
        if self.load_poll_s < 0:
            raise ValueError(f"load_poll_s must be >= 0 (0 = no polling), got {self.load_poll_s}")
        check_policy_kwargs(self.policy_kwargs)
        parse_tenant_mix(self.tenants)
        if self.admission_pricing not in ("queue", "slots"):
            raise ValueError(f"admission_pricing must be queue or slots, got {self.admission_pricing!r}")
        if self.vocab_size < 4:
            raise ValueError(f"vocab_size must be >= 4, got {self.vocab_size}")

    @property
    def total_replicas(self) -> int:
        """Every simulated replica: the decoding ones and the prefill ones (the KV capacity is split over all)."""
        return self.num_replicas + self.num_prefill_replicas

    def role_of(self, index: int) -> str:
        """Replicas ``0 .. num_replicas - 1`` decode (role both without prefill replicas), the rest prefill."""
        if index >= self.num_replicas:
            return "prefill"
        return "decode" if self.num_prefill_replicas else "both"


FP8_KV_CACHE_RATIO = 2
"""Bytes of the cost model's bf16 KV per byte of an FP8 cache of it."""


def cache_bytes_per_token(config: SimConfig) -> int:
    """KV bytes one token takes in the simulated replicas' cache, and moves: ``kv_bytes_per_token`` (the model's
    dtype, bf16), halved by an FP8 cache (``engine.kv_cache_dtype``)."""
    if config.engine.kv_cache_dtype == "auto":
        return config.kv_bytes_per_token
    return max(1, config.kv_bytes_per_token // FP8_KV_CACHE_RATIO)


def miniature(config: SimConfig, factor: int) -> SimConfig:
    """The same simulation with every token count divided by ``factor`` and every per-token cost
    multiplied by it: blocks of ``block_size / factor`` tokens (still one per hash id), a step
    budget ``factor`` times smaller. Model time, hit rates and queueing stay the same to within
    rounding, while hashing and token generation get ``factor`` times cheaper (quick cuts, tests).
    """
    engine = config.engine
    if factor < 1 or engine.block_size % factor:
        raise ValueError(f"miniature factor {factor} must divide block_size {engine.block_size}")
    c = config.cost
    cost = replace(c, prefill_s_per_token=c.prefill_s_per_token * factor,
                   load_s_per_token=c.load_s_per_token * factor,
                   decode_s_per_context_token=c.decode_s_per_context_token * factor)
    engine = replace(engine, block_size=engine.block_size // factor,
                     max_num_batched_tokens=max(1, engine.max_num_batched_tokens // factor))
    rules = config.router.transfers  # its token thresholds shrink with the tokens
    router = replace(config.router, transfers=replace(
        rules, pd_min_uncached_tokens=max(1, rules.pd_min_uncached_tokens // factor),
        pd_max_prefill_backlog_tokens=max(1, rules.pd_max_prefill_backlog_tokens // factor)))
    return replace(config, engine=engine, cost=cost, router=router,
                   kv_bytes_per_token=config.kv_bytes_per_token * factor)
