"""Generated multi-request workloads in the Mooncake ``hash_ids`` format (registered in registry.py: both
``kvmesh sim`` and ``kvmesh bench load`` run them).

- ``SyntheticTrace`` (``--synthetic``): multi-turn conversations of several tenants. A conversation
  starts with its tenant's system prompt (``system_blocks`` shared blocks), and each turn appends
  ``turn_blocks`` new blocks to the whole history, so turn *k* shares turn *k-1*'s prompt as a prefix.
  Conversations start as a Poisson process; turns follow each other after an exponential think time.
- ``tool_agent``: agents whose trajectories fork. An agent starts from its tenant's long tool
  definitions plus its own task; at every step it issues ``fanout`` tool calls at once, each a
  branch of the whole trajectory plus its own new blocks; the next step continues from one
  branch. Many requests share one long prefix and arrive together: a hot-spot generator.
- ``azure_conv`` / ``azure_code``: the Azure traces' arrival times and prompt/output lengths, with
  shared prefixes layered on: each request belongs to a tenant (Zipf popularity) whose system
  prompt opens it, and a share of requests continue a recent conversation of their tenant.
- ``bursty(...)``: any workload's arrivals warped into bursts (``burst_factor`` times the mean
  rate for ``burst_duty`` of every ``burst_period_s``, slower in between; same mean rate, same order).

Generated records carry a ``session_id`` (the conversation or agent) for session affinity.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, replace

from kvmesh.cluster.measure.workloads.traces import MOONCAKE_BLOCK_TOKENS, AzureRecord, MooncakeRecord


@dataclass(frozen=True, slots=True)
class SyntheticTrace:
    """Shape of a generated trace."""

    num_requests: int = 2000
    """Requests in total (the last conversation may be cut short)."""
    conversations_per_s: float = 1.0
    """Poisson rate at which conversations start."""
    num_tenants: int = 8
    """Distinct system prompts."""
    system_blocks: int = 8
    """Blocks (512 tokens each) of a tenant's system prompt."""
    turn_blocks: int = 4
    """Blocks each turn adds (user message + previous answer)."""
    turns: int = 6
    """Turns per conversation."""
    think_s: float = 20.0
    """Mean pause between the turns of a conversation."""
    output_tokens: int = 200
    """Tokens generated per request."""
    seed: int = 0
    """Seed of every random choice."""

    def __post_init__(self) -> None:
        if min(self.num_requests, self.num_tenants, self.turns, self.system_blocks + self.turn_blocks) < 1:
            raise ValueError("num_requests, num_tenants, turns and system_blocks + turn_blocks must be >= 1")
        if not self.conversations_per_s > 0 or self.think_s < 0:
            raise ValueError("conversations_per_s must be > 0 and think_s >= 0")

    def records(self) -> list[SessionRecord]:
        rng = random.Random(self.seed)
        next_id = itertools.count()
        systems = [[next(next_id) for _ in range(self.system_blocks)] for _ in range(self.num_tenants)]
        out: list[SessionRecord] = []
        start, conv = 0.0, 0
        while len(out) < self.num_requests:
            start += rng.expovariate(self.conversations_per_s)
            ids = list(systems[rng.randrange(self.num_tenants)])
            t, sid = start, f"conv-{conv}"
            conv += 1
            for _ in range(self.turns):
                ids = ids + [next(next_id) for _ in range(self.turn_blocks)]
                out.append(SessionRecord(1000.0 * t, len(ids) * MOONCAKE_BLOCK_TOKENS, self.output_tokens,
                                         tuple(ids), sid, self.system_blocks))
                t += rng.expovariate(1.0 / self.think_s) if self.think_s else 0.0
                if len(out) >= self.num_requests:
                    break
        out.sort(key=lambda r: r.timestamp_ms)
        return out


@dataclass(frozen=True, slots=True)
class SessionRecord(MooncakeRecord):
    """A trace record that belongs to a conversation or agent."""

    session_id: str | None = None
    """The conversation/agent id (``KVRouter.route(session_id=...)`` in the simulator)."""
    system_blocks: int = 0
    """Leading hash ids that are the tenant's shared system prompt (the load generator's system message)."""


@dataclass(frozen=True, slots=True)
class ToolAgentTrace:
    """Shape of a generated tool-agent trace."""

    num_requests: int = 3000
    """Requests in total (the last agent may be cut short)."""
    agents_per_s: float = 0.5
    """Poisson rate at which agents start."""
    num_tenants: int = 4
    """Distinct tool-definition prefixes."""
    tools_blocks: int = 24
    """Blocks (512 tokens each) of a tenant's tool definitions + instructions."""
    task_blocks: int = 4
    """Blocks of an agent's own task description."""
    steps: int = 6
    """Steps per agent."""
    fanout: int = 4
    """Parallel tool calls (branches) issued at each step."""
    branch_blocks: int = 1
    """Blocks each branch adds (its tool call and result)."""
    step_s: float = 5.0
    """Mean pause between steps (tool latency + thinking)."""
    output_tokens: int = 150
    """Tokens generated per request."""
    seed: int = 0
    """Seed of every random choice."""

    def __post_init__(self) -> None:
        if min(self.num_requests, self.num_tenants, self.steps, self.fanout, self.tools_blocks) < 1:
            raise ValueError("num_requests, num_tenants, steps, fanout and tools_blocks must be >= 1")
        if not self.agents_per_s > 0 or self.step_s < 0 or self.branch_blocks < 1:
            raise ValueError("agents_per_s must be > 0, step_s >= 0 and branch_blocks >= 1")

    def records(self) -> list[SessionRecord]:
        rng = random.Random(self.seed)
        ids = itertools.count()
        tools = [[next(ids) for _ in range(self.tools_blocks)] for _ in range(self.num_tenants)]
        out: list[SessionRecord] = []
        start, agent = 0.0, 0
        while len(out) < self.num_requests:
            start += rng.expovariate(self.agents_per_s)
            trajectory = tools[rng.randrange(self.num_tenants)] + [next(ids) for _ in range(self.task_blocks)]
            t, sid = start, f"agent-{agent}"
            agent += 1
            for _ in range(self.steps):
                branches = [trajectory + [next(ids) for _ in range(self.branch_blocks)] for _ in range(self.fanout)]
                for b in branches:
                    out.append(SessionRecord(1000.0 * (t + rng.uniform(0, 0.05)), len(b) * MOONCAKE_BLOCK_TOKENS,
                                             self.output_tokens, tuple(b), sid, self.tools_blocks))
                trajectory = branches[rng.randrange(self.fanout)] + [next(ids)]  # the agent's next thought
                t += rng.expovariate(1.0 / self.step_s) if self.step_s else 0.0
                if len(out) >= self.num_requests:
                    break
        out.sort(key=lambda r: r.timestamp_ms)
        return out[: self.num_requests]


@dataclass(frozen=True, slots=True)
class AzurePrefixes:
    """How shared prefixes are layered onto an Azure trace (which has lengths, not contents)."""

    num_tenants: int = 32
    """Distinct system prompts."""
    zipf_s: float = 1.1
    """Tenant popularity: P(tenant k) ~ 1 / k**zipf_s."""
    system_blocks: int = 2
    """Blocks (512 tokens) of a tenant's system prompt (cut to the request's length)."""
    followup_share: float = 0.4
    """Share of requests that continue a recent conversation of their tenant (its prompt is the
    conversation's last prompt plus new blocks, when the request is long enough)."""
    open_conversations: int = 8
    """Recent conversations kept per tenant to continue."""
    seed: int = 0
    """Seed of every random choice."""

    def __post_init__(self) -> None:
        if self.num_tenants < 1 or self.system_blocks < 0 or self.open_conversations < 1:
            raise ValueError("num_tenants and open_conversations must be >= 1, system_blocks >= 0")
        if not 0 <= self.followup_share <= 1 or self.zipf_s < 0:
            raise ValueError("followup_share must be in [0, 1] and zipf_s >= 0")

    def records(self, azure: list[AzureRecord]) -> list[SessionRecord]:
        rng = random.Random(self.seed)
        ids = itertools.count()
        weights = [1.0 / (k + 1) ** self.zipf_s for k in range(self.num_tenants)]
        systems = [[next(ids) for _ in range(self.system_blocks)] for _ in range(self.num_tenants)]
        open_convs: list[list[tuple[str, list[int]]]] = [[] for _ in range(self.num_tenants)]
        out, conv_ids = [], itertools.count()
        for a in azure:
            tenant = rng.choices(range(self.num_tenants), weights)[0]
            n_blocks = math.ceil(a.context_tokens / MOONCAKE_BLOCK_TOKENS)
            convs = open_convs[tenant]
            pick = [c for c in convs if len(c[1]) < n_blocks] if rng.random() < self.followup_share else []
            if pick:
                sid, prefix = pick[rng.randrange(len(pick))]
                convs.remove((sid, prefix))
            else:
                sid, prefix = f"conv-{next(conv_ids)}", systems[tenant][:n_blocks]
            blocks = prefix + [next(ids) for _ in range(n_blocks - len(prefix))]
            convs.append((sid, blocks))
            if len(convs) > self.open_conversations:
                convs.pop(0)
            out.append(SessionRecord(1000.0 * a.arrival_s, a.context_tokens, a.generated_tokens,
                                     tuple(blocks), sid))
        return out


def bursty(records: list[MooncakeRecord], burst_factor: float = 4.0, burst_duty: float = 0.2,
           burst_period_s: float = 60.0) -> list[MooncakeRecord]:
    """Arrivals warped so each period opens with a burst of ``burst_factor`` x the mean rate.

    Original time ``t`` is read as arrival *mass*; within a period, new time ``T`` absorbs mass at
    ``k = burst_factor`` for the first ``d = burst_duty`` of it and at ``k' = (1 - d*k) / (1 - d)``
    after, so the mean rate and the order of requests are unchanged.
    """
    k, d, period = burst_factor, burst_duty, burst_period_s
    if not (k >= 1 and 0 < d < 1 and d * k < 1 and period > 0):
        raise ValueError(f"bursts need burst_factor >= 1, 0 < burst_duty < 1 and burst_factor * burst_duty < 1 "
                         f"(the rest of the period must absorb the remaining mass); got {k}, {d}")
    k_rest = (1 - d * k) / (1 - d)
    out = []
    for r in records:
        t = r.timestamp_ms / 1000.0
        n, within = divmod(t, period)
        burst_mass = k * d * period
        warped = within / k if within < burst_mass else d * period + (within - burst_mass) / k_rest
        out.append(replace(r, timestamp_ms=1000.0 * (n * period + warped)))
    return out
