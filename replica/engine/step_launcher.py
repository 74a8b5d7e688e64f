"""``StepLauncher``: a scheduled step run on the model runner, its tokens read back and its time learned.

    launch(sched) ── execute_model, or execute_model_async (async_scheduling.py) ──▶ LaunchedStep
    ready(launched) ── the step whose tokens are read now: this one, or (async) the one launched before it
    read(step) ──▶ {request_id: token}; launch to read, less the launch's adapter slot loads, taught to
                   PrefillRate (prompt tokens ran) or DecodeStepTime (decode only)

An adapter's load into a slot is left out of the step's time: ``/load`` reports it apart (``lora.load_bytes_per_s``)
and the router prices it apart, so a replica that just swapped adapters does not look slower at prefill than it is.

Errors are the engine's to handle (it fails the step's requests and serves on).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kvmesh.replica.engine.async_scheduling import LaunchedStep, add_placeholders, use_async_scheduling
from kvmesh.replica.engine.prefill_rate import PrefillRate
from kvmesh.replica.engine.step_time import DecodeStepTime

if TYPE_CHECKING:
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.engine.stats import EngineStats
    from kvmesh.replica.interfaces import AsyncModelRunner, ModelRunnerInterface
    from kvmesh.replica.step.scheduler_output import SchedulerOutput


class StepLauncher:
    """Runs the engine's steps on ``model_runner`` (one thread: the engine's)."""

    def __init__(self, config: EngineConfig, model_runner: ModelRunnerInterface, stats: EngineStats) -> None:
        self.model_runner = model_runner
        self.stats = stats
        self.async_scheduling = use_async_scheduling(config, model_runner)
        self.in_flight: LaunchedStep | None = None
        """Async scheduling: the step launched last, its tokens not read yet."""
        self.prefill_rate = PrefillRate()
        """Prompt tokens per second this engine computes, from its own steps (reported in ``/load``)."""
        self.decode_step_time = DecodeStepTime()
        """Its decode steps' seconds by batch and context, fitted on its own decode-only steps (``/load``)."""

    def launch(self, sched: SchedulerOutput, requests: dict[str, Request]) -> LaunchedStep:
        """Run the step (async scheduling: launch it, placeholders for its tokens on ``requests``)."""
        runner = self.model_runner
        start, loads_s = time.monotonic(), runner.lora_load_seconds()
        if self.async_scheduling:
            async_runner: AsyncModelRunner = runner  # use_async_scheduling saw it launch steps
            output = async_runner.execute_model_async(sched)
            step_requests = {rid: requests[rid] for rid in sched.request_ids()}
            add_placeholders(requests, sched)
        else:
            output, step_requests = runner.execute_model(sched), None
        loads_s = runner.lora_load_seconds() - loads_s  # slots are written at launch, before the forward
        self.stats.record_step(sched.num_batched_tokens)
        return LaunchedStep(sched, output, step_requests, start, loads_s)

    def ready(self, launched: LaunchedStep | None) -> LaunchedStep | None:
        """The step whose tokens are read now: ``launched`` itself, or with async scheduling the one before it."""
        if not self.async_scheduling:
            return launched
        ready, self.in_flight = self.in_flight, launched
        return ready

    def read(self, step: LaunchedStep, requests: dict[str, Request]) -> dict[str, int]:
        """The step's sampled tokens (waits for them); its time taught to the rate it measures."""
        sampled = step.sampled(requests)
        seconds = time.monotonic() - step.launched_at - step.adapter_load_s
        if step.sched.scheduled:  # prompt tokens ran in it: launch to tokens read is its time
            self.prefill_rate.record(step.sched.num_batched_tokens, seconds)
        elif step.sched.decode_request_ids:  # decode only: the step-time model's sample (no device sync)
            self.decode_step_time.record_step(requests, step.sched.decode_request_ids, seconds)
        return sampled
