"""``kvmesh sim``'s and ``kvmesh sim scaling``'s settings: the simulated cluster (``SimConfig``), the workload
and the comparison (the autoscaler and the varying rate), one dataclass each; their flags
(``--num-replicas``, ``--workload``, ``--max-replicas`` ...) are derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from kvmesh.cluster.config.autoscale import AutoscaleConfig
from kvmesh.cluster.config.schema import Schema
from kvmesh.cluster.config.trees import ROUTER_FIXED
from kvmesh.cluster.measure.sim.config import SimConfig, sim_engine
from kvmesh.cluster.measure.sim.lora_config import ADAPTER_AFFINITY_MODES
from kvmesh.cluster.measure.workloads.arrivals import ARRIVAL_SPREADS
from kvmesh.cluster.measure.workloads.registry import get_workload
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings, WorkloadShape
from kvmesh.cluster.measure.workloads.traces import default_trace
from kvmesh.replica.config import EngineConfig
from kvmesh.router.config import RouterConfig

SESSION_MODES: dict[str, dict[str, bool]] = {
    "off": {" ": False}, "on": {"/sessions": True}, "both": {"/no-sessions": False, "/sessions": True}}
"""``--sessions`` mode -> {label suffix: whether the run passes session ids}."""


@dataclass(frozen=True, slots=True)
class SimWorkloadOptions:
    """The requests to simulate: a trace, a generated workload, a window of it, bursts."""

    workload: str = "mooncake"
    """A registered workload (listed below; cluster/measure/workloads/registry.py)."""
    trace: str | None = None
    """Trace file of mooncake (JSONL) and the azure workloads (CSV); default: the shared one."""
    synthetic: int | None = None
    """Simulate N requests of the generated multi_turn workload (--workload multi_turn --num-requests N)."""
    synthetic_rate: float = 1.0
    """Sessions (conversations, agents, questions) a generated workload starts per second."""
    num_requests: int = 2000
    """Requests of a generated workload."""
    prompt_tokens: int = 16384
    """Generated prompt size in tokens: chatbot's and rag's prompt, random's longest, multi_turn's last turn."""
    burst: float = 0.0
    """Warp arrivals into bursts of this factor x the mean rate (0 = off; burst * --burst-duty < 1)."""
    burst_duty: float = 0.2
    """Fraction of each burst period that bursts."""
    burst_period: float = 60.0
    """Seconds between burst starts."""
    start: int = 0
    """Skip the first N requests (a window of the trace)."""
    limit: int | None = None
    """Use only N requests (from --start)."""
    max_prompt_blocks: int | None = None
    """Truncate prompts to this many hash ids (keeps prefixes; for quick cuts)."""
    arrival_seed: int | None = None
    """A replication: each trace request arrives at a time drawn inside its timestamp's tick, a generated workload
    is redrawn; every policy sees the same arrivals (None: the trace's timestamps as they are)."""
    arrival_clock_ms: float | None = None
    """Stamp the arrivals on a clock of this many milliseconds of the workload's time (before --time-scale): each
    moves down to the start of its tick, so a tick's requests arrive together, as from a trace logged in whole
    seconds (bursts: an agent's fan-out, a batch client). None: the stamps as they are."""
    arrival_spread: str = "jitter"
    """What --arrival-seed varies in a trace: ``jitter``, each arrival drawn inside its tick; ``order``, every request
    kept on its stamp (a tick's requests together) and the order within a tick drawn (which is routed first, and
    which router takes it); ``fanout``, a tick's requests arriving within --fanout-ms of its start, each at a drawn
    time (a burst with a width: an agent's calls a few milliseconds apart). A generated workload is redrawn in all."""
    fanout_ms: float = 10.0
    """With --arrival-spread fanout: the window a tick's requests arrive in, in milliseconds of the replay (after
    --time-scale, the time the routers see)."""

    def __post_init__(self) -> None:
        get_workload(self.workload)
        if self.arrival_spread not in ARRIVAL_SPREADS:
            raise ValueError(f"arrival_spread must be one of {', '.join(ARRIVAL_SPREADS)}; "
                             f"got {self.arrival_spread!r}")
        if not self.fanout_ms > 0:
            raise ValueError(f"fanout_ms must be > 0 milliseconds, got {self.fanout_ms}")
        if self.arrival_clock_ms is not None and not self.arrival_clock_ms > 0:
            raise ValueError(f"arrival_clock_ms must be > 0 milliseconds, got {self.arrival_clock_ms}")

    def settings(self, seed: int, shape: WorkloadShape) -> WorkloadSettings:
        """The registry's settings (``--synthetic N`` is ``--workload multi_turn --num-requests N``)."""
        return WorkloadSettings(num_requests=self.synthetic or self.num_requests, trace=self.trace,
                                rate=self.synthetic_rate, prompt_tokens=self.prompt_tokens, shape=shape, seed=seed)


@dataclass(frozen=True, slots=True)
class SimCompareOptions:
    """Which runs are compared, and how the simulated cluster is adjusted for them."""

    policies: str | None = None
    """Comma-separated routing policies (default: the router's policies; the rivals' formulas, dynamo, llmd,
    llmd_precise and sglang, sim/rivals/, run when named here)."""
    sessions: str = "off"
    """Pass the workload's session ids to the router: off, on, or both side by side."""
    miniature: int = 1
    """Divide every token count by this and multiply per-token costs by it: same model time, that many
    times less hashing (quick runs; 1 = off)."""
    cost: dict[str, float] = field(default_factory=dict)
    """Override a CostModel constant, e.g. --cost prefill_s_per_token=1e-4."""
    ceilings: bool = True
    """Compute the infinite-cache and single-pool hit-rate ceilings."""
    pd_compare: bool = False
    """Run each policy four ways at the same total of replicas: all of role both, with peer pulls, split into
    --num-prefill-replicas (1 when 0) prefill + the rest decode, and split with peer pulls (also a _kv_transfer.png)."""

    adapter_affinity: str = "on"
    """Route LoRA requests adapter-aware (on), adapter-blind (off: lora_name hidden, no /load lora section;
    sim/lora.py), or both side by side."""

    def __post_init__(self) -> None:
        if self.sessions not in SESSION_MODES:
            raise ValueError(f"sessions must be one of {', '.join(SESSION_MODES)}; got {self.sessions!r}")
        if self.adapter_affinity not in ADAPTER_AFFINITY_MODES:
            raise ValueError(f"adapter_affinity must be one of {', '.join(ADAPTER_AFFINITY_MODES)}; "
                             f"got {self.adapter_affinity!r}")


@dataclass(frozen=True, slots=True)
class SimCommandConfig:
    """One ``kvmesh sim`` comparison."""

    sim: SimConfig = field(default_factory=SimConfig)
    """The simulated cluster: replicas, their KV pools and steps, the router(s)."""
    engine: EngineConfig = field(default_factory=sim_engine)
    """The simulated replicas' engine: block size and scheduler budgets."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """The router: its predictions and session pins."""
    workload: SimWorkloadOptions = field(default_factory=SimWorkloadOptions)
    """The requests."""
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    """How a generated workload shares its prompts (tenants, turns, documents)."""
    compare: SimCompareOptions = field(default_factory=SimCompareOptions)
    """The runs compared."""

    def __post_init__(self) -> None:  # the simulated cluster holds the engine and router sections whole
        object.__setattr__(self, "sim", replace(self.sim, engine=self.engine, router=self.router))


SIM_ENGINE_FIELDS = ("block_size", "max_num_batched_tokens", "max_num_seqs", "scheduling_policy", "kv_cache_dtype")
"""What a simulated replica reads of its engine section."""
SIM_ROUTER_FIELDS = ("predict_ttl_s", "predict_hold_s", "sessions", "transfers", "admission")
"""What the simulated router reads of its section (besides the policy, compared, and the engine's block size):
of ``sessions`` its ``ttl_s``, of ``transfers`` all but what ``_unread_sections`` hides."""


def _unread_sections() -> dict[str, str]:
    """The fields of the engine and router sections the simulator does not read, hidden with the reason."""
    hidden = {"sim.engine": "set the engine section", "sim.router": "set the router section",
              "router.block_size": "the router uses engine.block_size", "router.policy": "--policies",
              "router.policy_kwargs": "--policy-kwargs tunes every policy compared",
              "router.transfers.peer_pulls": "--peer-pulls (the simulated replicas' KV transfer on or off)",
              "router.transfers.peer_pull_assumed_bytes_per_s": "the simulated replicas report their pull rate "
                                                                "(--kv-transfer-bytes-per-s)",
              "router.admission.enabled": "--admission (off by default in the simulator, to compare with before)",
              "router.admission.keys_file": "tenants, priorities and targets come from --tenants",
              "router.admission.recheck_interval_s": "the simulator re-checks at every arrival, step end and deadline",
              } | ROUTER_FIXED
    hidden |= {f"engine.{f.name}": "a simulated replica runs no model (its step time is the cost model)"
               for f in fields(EngineConfig) if f.name not in SIM_ENGINE_FIELDS}
    return {f"router.{f.name}": "the simulated router has no HTTP side and no event sockets"
            for f in fields(RouterConfig) if f.name not in SIM_ROUTER_FIELDS} | hidden


SIM_SCHEMA = Schema(SimCommandConfig, hidden=_unread_sections() | {
    "sim.cost": "--cost FIELD=SECONDS",
    "sim.num_routers": "--routers N[,N...] (one run per count)",
    "sim.use_sessions": "--sessions off|on|both",
    "sim.lora.adapter_aware": "--adapter-affinity on|off|both",
})


@dataclass(frozen=True, slots=True)
class ScalingOptions:
    """The trace at a rate that varies, and how long a new replica takes (``kvmesh sim scaling``)."""

    trace: str = field(default_factory=default_trace)
    """Mooncake JSONL trace."""
    limit: int | None = None
    """First N requests of the trace."""
    period: float = 60.0
    """Seconds of trace per slow and per fast phase."""
    slow_factor: float = 4.0
    """Slow phases run at 1/this of the rate."""
    startup: float = 30.0
    """Seconds from a scale-up to the replica serving."""
    policy: str = "cache_aware"
    """Routing policy of both fleets."""


def _scaling_autoscale() -> AutoscaleConfig:
    return AutoscaleConfig(scale_with_load=True, max_replicas=8, target_in_flight=32.0)


@dataclass(frozen=True, slots=True)
class ScalingCommandConfig:
    """An autoscaled fleet against a fixed one sized for the peak."""

    sim: SimConfig = field(default_factory=SimConfig)
    """The simulated replicas and router (as many replicas as autoscale.max_replicas for the fixed fleet)."""
    engine: EngineConfig = field(default_factory=sim_engine)
    """The simulated replicas' engine: block size and scheduler budgets."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """The router: its predictions and session pins."""
    autoscale: AutoscaleConfig = field(default_factory=_scaling_autoscale)
    """The autoscaler, as ``kvmesh serve`` runs it."""
    scaling: ScalingOptions = field(default_factory=ScalingOptions)
    """The trace and the replicas' startup."""

    def __post_init__(self) -> None:  # the simulated cluster holds the engine and router sections whole
        object.__setattr__(self, "sim", replace(self.sim, engine=self.engine, router=self.router,
                                                num_replicas=self.autoscale.max_replicas))


SCALING_SCHEMA = Schema(ScalingCommandConfig, hidden=_unread_sections() | {
    "sim.num_replicas": "autoscale.max_replicas (the fixed fleet)",
    **{name: "the autoscaled fleet's replicas are of role both, without KV transfers" for name in (
        "sim.num_prefill_replicas", "sim.pd_prefill_pick", "sim.peer_pulls", "sim.kv_transfer_bytes_per_s",
        "sim.kv_transfer_latency_s", "sim.kv_bytes_per_token", "router.transfers")},
    "sim.cost": "the default cost model",
    "autoscale.scale_with_load": "always on here",
    "autoscale.drain_timeout_s": "a drained simulated replica leaves when its last request ends",
})
