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

T = TypeVar("T")


def read_racily(read: Callable[[], list[T]]) -> list[T]:
    """``read()`` retried while the engine thread mutates the dict it iterates (gives up empty)."""
    for _ in range(5):
        try:
            return read()
        except RuntimeError:
            continue
    return []


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
    return LoadReport(
        num_requests_running=len(sched.running), num_requests_waiting=len(sched.waiting),
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
