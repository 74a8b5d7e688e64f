"""The one registry of named workloads: each makes ``hash_ids`` records from ``WorkloadSettings``.

``kvmesh sim --workload NAME`` simulates the records as they are; ``kvmesh bench load --workload NAME``
renders them into prompt sessions (``sessions.render``): a *replay* workload sends each record alone
at its timestamp, a *conversation* workload sends a session's records as the turns of one chat.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvmesh.cluster.measure.workloads import single_turn
from kvmesh.cluster.measure.workloads.adapters import adapter_requests
from kvmesh.cluster.measure.workloads.generated import (
    AzurePrefixes,
    SessionRecord,
    SyntheticTrace,
    ToolAgentTrace,
)
from kvmesh.cluster.measure.workloads.settings import WorkloadSettings
from kvmesh.cluster.measure.workloads.traces import (
    DEFAULT_TRACE,
    MOONCAKE_BLOCK_TOKENS,
    AzureRecord,
    MooncakeRecord,
    default_trace,
    read_azure,
    read_mooncake,
)

AZURE_CONV = "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = "AzureLLMInferenceTrace_code.csv"
Records = Callable[[WorkloadSettings], list[MooncakeRecord]]
"""A workload's generator: settings in, records (sorted by timestamp) out."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One registered workload."""

    name: str
    """``--workload NAME`` in both commands."""
    doc: str
    """One line for the commands' help (the generator's docstring)."""
    records: Records
    """Makes the records."""
    conversation: bool
    """Load generator: a session's records are the turns of one chat, started by its loop (False: a replay)."""
    real_lengths: bool = False
    """Load generator: lengths are kept as real tokens (x --length-scale), not shrunk to --trace-block-tokens."""
    trace_file: str | None = None
    """The shared trace (``default_trace(trace_file)``) read when no ``trace`` is given; None: generated."""

    def make(self, settings: WorkloadSettings) -> list[MooncakeRecord]:
        """The records for ``settings`` (a trace workload without ``settings.trace`` reads its shared trace)."""
        if self.trace_file and not settings.trace:
            settings = replace(settings, trace=default_trace(self.trace_file))
        return self.records(settings)


WORKLOADS: dict[str, Workload] = {}


def register(name: str, *, conversation: bool, real_lengths: bool = False, trace_file: str | None = None,
             doc: str | None = None) -> Callable[[Records], Records]:
    """Register a generator under ``name``; ``doc`` (default: the first line of its docstring) documents it."""

    def add(records: Records) -> Records:
        line = doc or (records.__doc__ or name).strip().splitlines()[0]
        WORKLOADS[name] = Workload(name, line, records, conversation, real_lengths, trace_file)
        return records

    return add


TTFT_SLO_S: dict[str, float] = {"mooncake": 2.0, "azure": 0.5, "azure_conv": 0.5, "azure_code": 0.5,
                                 "tool_agent": 10.0, "multi_turn": 1.0, "chatbot": 1.0, "rag": 1.0, "random": 1.0,
                                 "lora": 1.0}
"""The one table of each workload's time-to-first-token target, in seconds, that goodput counts requests against
(``kvmesh sim``'s ``ttft_slo`` per run, the policy verdict's goodput): 0.5 s for the Azure traces' chat and code
prompts (a few thousand tokens), 1 s for the generated chats (16k-token prompts), 2 s for Mooncake's long contexts,
10 s for an agent's tool steps (no person waits on each)."""


def ttft_slo_s(name: str) -> float | None:
    """The TTFT target of workload ``name`` (None: it has none)."""
    return TTFT_SLO_S.get(name)


def workload_names() -> tuple[str, ...]:
    return tuple(WORKLOADS)


def get_workload(name: str) -> Workload:
    """The workload registered as ``name``; a ValueError naming every registered one otherwise."""
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}; got {name!r}")
    return WORKLOADS[name]


def describe() -> str:
    """The registered workloads, one per line, for the commands' ``--help``."""
    width = max(map(len, WORKLOADS))
    return "workloads (--workload; the same in kvmesh sim and kvmesh bench load):\n" + "\n".join(
        f"  {w.name:<{width}}  {w.doc}" for w in WORKLOADS.values())


def _given(**values: float | int | None) -> dict[str, float | int]:
    return {k: v for k, v in values.items() if v is not None}


def _azure(s: WorkloadSettings) -> list[AzureRecord]:
    return read_azure(str(s.trace), limit=s.trace_limit)


@register("mooncake", conversation=False, trace_file=DEFAULT_TRACE)
def mooncake(s: WorkloadSettings) -> list[MooncakeRecord]:
    """A Mooncake hash_ids trace (--trace), its prefixes as recorded."""
    return read_mooncake(str(s.trace), limit=s.trace_limit)


@register("azure", conversation=False, real_lengths=True, trace_file=AZURE_CONV)
def azure(s: WorkloadSettings) -> list[MooncakeRecord]:
    """An Azure trace's arrivals and lengths, no shared prefixes."""
    ids = itertools.count()
    return [SessionRecord(1000.0 * a.arrival_s, a.context_tokens, a.generated_tokens,
                          tuple(next(ids) for _ in range(math.ceil(a.context_tokens / MOONCAKE_BLOCK_TOKENS))))
            for a in _azure(s)]


@register("azure_code", conversation=False, trace_file=AZURE_CODE,
          doc="Azure code trace + generated tenant prefixes and follow-ups.")
@register("azure_conv", conversation=False, trace_file=AZURE_CONV)
def azure_prefixed(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Azure conversation trace + generated tenant prefixes and follow-ups."""
    return list(AzurePrefixes(seed=s.seed).records(_azure(s)))


@register("tool_agent", conversation=False)
def tool_agent(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Agents forking parallel tool calls off one long trajectory."""
    trace = ToolAgentTrace(num_requests=s.num_requests, seed=s.seed,
                           **_given(agents_per_s=s.rate, output_tokens=s.output_tokens))
    return list(trace.records())


@register("multi_turn", conversation=True)
def multi_turn(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Tenants' conversations: each turn resends the history + new blocks."""
    shape = s.shape
    share = 0.25 if shape.system_share is None else shape.system_share
    system = round(s.prompt_tokens * share / MOONCAKE_BLOCK_TOKENS)
    per_turn = (s.prompt_tokens - system * MOONCAKE_BLOCK_TOKENS - (shape.turns - 1) * s.answer_tokens) // shape.turns
    trace = SyntheticTrace(num_requests=s.num_requests, num_tenants=shape.num_prefixes, system_blocks=system,
                           turn_blocks=max(1, per_turn // MOONCAKE_BLOCK_TOKENS), turns=shape.turns, seed=s.seed,
                           **_given(conversations_per_s=s.rate, output_tokens=s.output_tokens))
    return list(trace.records())


@register("chatbot", conversation=True)
def chatbot(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Tenants' system prompts (--num-prefixes) + a unique question."""
    shape = s.shape
    return list(single_turn.chatbot(s.num_requests, s.prompt_tokens, num_tenants=shape.num_prefixes, seed=s.seed,
                                    **_given(system_share=shape.system_share, rate=s.rate,
                                             output_tokens=s.output_tokens)))


@register("rag", conversation=True)
def rag(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Instructions + a document (--num-documents) + a unique question."""
    shape = s.shape
    return list(single_turn.rag(s.num_requests, s.prompt_tokens, num_documents=shape.num_documents, seed=s.seed,
                                **_given(instruction_share=shape.system_share, rate=s.rate,
                                         output_tokens=s.output_tokens)))


@register("random", conversation=True)
def random_prompts(s: WorkloadSettings) -> list[MooncakeRecord]:
    """Unrelated prompts of random length (no shared prefixes)."""
    return list(single_turn.random_prompts(s.num_requests, s.prompt_tokens, seed=s.seed,
                                           **_given(rate=s.rate, output_tokens=s.output_tokens)))


@register("lora", conversation=True)
def lora(s: WorkloadSettings) -> list[MooncakeRecord]:
    """LoRA adapters (--num-adapters, Zipf --adapter-zipf) and base models (--num-models), prefixes of their own."""
    shape = s.shape
    return list(adapter_requests(s.num_requests, s.prompt_tokens, shape.adapters, seed=s.seed,
                                 **_given(system_share=shape.system_share, rate=s.rate, output_tokens=s.output_tokens)))
