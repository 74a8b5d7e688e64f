"""``AsyncLLM.load_report`` and its helpers: reading racily off the engine thread's state, the event stream's
fields, the LoRA section."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kvmesh.replica.emulate.runner import EmulatedModelRunner
from kvmesh.replica.engine.loras import EngineLoRAs
from kvmesh.replica.engine.request import Request
from kvmesh.replica.engine.step_time import decode_step_load
from kvmesh.replica.interfaces import EventPublisher, StreamPublisher
from kvmesh.replica.serving.load_report import LoadReport, LoRALoad

if TYPE_CHECKING:
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.engine.scheduler import Scheduler

T = TypeVar("T")


def read_racily(read: Callable[[], list[T]]) -> list[T]:
    """``read()`` retried while the engine thread mutates the dict it iterates (gives up empty)."""
    for _ in range(5):
        try:
            return read()
        except RuntimeError:
            continue
    return []


def queue_counts(sched: Scheduler, joining: int, max_num_seqs: int) -> tuple[int, int]:
    """Running and waiting requests as a router reads them (racily, off the engine thread). A request no step has
    tried yet -- in ``waiting`` since the last ``schedule``, or accepted and not taken in by the engine thread
    (``joining``) -- counts as running when the next step starts it (nothing was left waiting and a running slot is
    free), else as waiting. A router reads waiting requests beside running ones as every slot taken
    (router/admission/room.py): a request caught between its arrival and the next step, on a busy host, taught
    admission that the replica runs one request at a time."""
    running, waiting = len(sched.running), len(sched.waiting)
    left = min(sched.left_waiting, waiting)
    untried = waiting - left + joining
    starts = 0 if left else min(untried, max(0, max_num_seqs - running))
    return running + starts, left + untried - starts


def event_stream_report(publisher: EventPublisher | None) -> dict[str, int | float]:
    """``LoadReport``'s event fields of a ``ZmqEventPublisher`` (none for no or another publisher)."""
    if not isinstance(publisher, StreamPublisher):
        return {}
    return {"kv_events_seq": publisher.seq - 1, "kv_events_unsent_s": publisher.unsent_s()}


def lora_report(loras: EngineLoRAs, running: list[Request]) -> LoRALoad:
    """``LoadReport.lora`` (adapters, slots, the running requests' adapters), read racily off the engine thread:
    retried while it mutates what is read; an empty section with the engine's settings if it kept changing."""
    for _ in range(5):
        try:
            return loras.load([r.lora_name for r in list(running)])
        except RuntimeError:
            continue
    return LoRALoad(enabled=loras.enabled, max_loras=loras.max_loras, max_lora_rank=loras.max_lora_rank)


def load_report(engine: LLMEngine) -> LoadReport:
    """Queue depth, KV usage and uncomputed prompt tokens (read racily from the engine thread's state)."""
    sched = engine.scheduler
    requests = read_racily(lambda: list(sched.requests.values()))
    waiting_tokens = sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in requests)
    running, waiting = queue_counts(sched, 0, engine.config.max_num_seqs)
    return LoadReport(
        num_requests_running=running, num_requests_waiting=waiting,
        kv_cache_usage=float(engine.kv_cache_manager.usage), num_waiting_prefill_tokens=waiting_tokens,
        num_kv_blocks=engine.num_kv_blocks, block_size=engine.config.block_size,
        max_num_seqs=engine.config.max_num_seqs, scheduling_policy=engine.config.scheduling_policy,
        prefill_tokens_per_s=engine.prefill_rate.tokens_per_s,
        num_grammar_compiles=len(read_racily(engine.structured_output.compiling)),
        lora=lora_report(engine.loras, sched.running),
        **engine.kv_connectors.load_fields(),
        decode_step=decode_step_load(engine.decode_step_time, read_racily(lambda: list(sched.running))),
        emulation=runner.clock.report() if isinstance(runner := engine.model_runner, EmulatedModelRunner) else None,
        **event_stream_report(engine.event_publisher))
