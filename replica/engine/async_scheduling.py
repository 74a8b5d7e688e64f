"""Async scheduling (vLLM's): the engine schedules and launches step N+1 before it reads step N's tokens.

    step():  schedule N+1 ─ launch N+1 (execute_model_async) ─ get() N's tokens ─ stop checks, outputs of N
    device:  ....... step N ........│....... step N+1 .......│   (the host's work hides behind the device's)

A token sampled but not yet read by the host is a placeholder (``Request.num_output_placeholders``): the
scheduler counts it (the request decodes by id), and the runner feeds it to step N+1 from step N's
sampled tensor on the device (input_batch.py). The host learns step N's tokens one step later, so:

- a request that stops at step N (EOS, stop token or string) also runs in step N+1; that token is dropped;
- a request whose step-N token is its last by max_tokens gets no placeholder and is not scheduled again;
- a request preempted while its token is in flight gets the token when it arrives, and resumes with it.

The tokens are those of synchronous scheduling (tests/replica/test_engine_async_scheduling.py); unseeded
random sampling draws from the runner's generator in a different order (the extra rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig

if TYPE_CHECKING:
    from kvmesh.replica.engine.llm_engine import LLMEngine
    from kvmesh.replica.engine.outputs import RequestOutput
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.engine.scheduler_output import SchedulerOutput
    from kvmesh.replica.interfaces import AsyncModelRunner, ModelRunnerInterface
    from kvmesh.replica.worker.async_output import AsyncModelRunnerOutput


@dataclass(frozen=True, slots=True)
class LaunchedStep:
    """A step launched on the device whose sampled tokens the host has not read yet."""

    sched: SchedulerOutput
    """What the step computes."""
    output: AsyncModelRunnerOutput
    """Its result on the way to the host (``get()`` waits for it)."""
    requests: dict[str, Request]
    """The step's Request objects: an id aborted and reused before ``get()`` must not get this step's token."""


def use_async_scheduling(config: EngineConfig, model_runner: ModelRunnerInterface) -> bool:
    """``config.async_scheduling``, or for None: on when the runner is on CUDA and can launch steps."""
    can = callable(getattr(model_runner, "execute_model_async", None))
    if config.async_scheduling and not can:
        raise ValueError(f"async_scheduling=True needs a model runner that launches steps without waiting; "
                         f"{type(model_runner).__name__} cannot (tensor_parallel_size > 1?): drop async_scheduling")
    if config.async_scheduling is None:
        return can and str(getattr(model_runner, "device", "cpu")).startswith("cuda")
    return config.async_scheduling


def step_async(engine: LLMEngine) -> list[RequestOutput]:
    """One ``LLMEngine.step()`` under async scheduling: launch this step, return the previous one's outputs."""
    outputs, engine._pending = engine._pending, []
    sched = engine.scheduler.schedule()
    launched = None
    requests = engine.scheduler.requests
    runner: AsyncModelRunner = engine.model_runner  # use_async_scheduling saw it launch steps
    if not sched.is_empty:
        try:
            launched = LaunchedStep(sched, runner.execute_model_async(sched),
                                    {rid: requests[rid] for rid in sched.request_ids()})
            engine._stats.record_step(sched.num_batched_tokens)
            add_placeholders(requests, sched)
        except Exception as e:
            outputs += engine._fail_step(sched, e)
    else:
        engine.scheduler.finished_request_ids |= sched.finished_request_ids  # tell the runner next time
    previous, engine._in_flight = engine._in_flight, launched
    if previous is not None:
        try:
            sampled = previous.output.get()
            for request_id in [rid for rid in sampled if requests.get(rid) is not previous.requests[rid]]:
                del sampled[request_id]  # ended (and its id reused) while the step ran
        except Exception as e:
            outputs += engine._fail_step(previous.sched, e)
            sampled = {}
        outputs += engine._process_sampled(sampled)
    engine._end_step()
    return outputs


def add_placeholders(requests: dict[str, Request], sched: SchedulerOutput) -> None:
    """Count the tokens a launched step samples, except a request's last by max_tokens (it ends then)."""
    for request_id in [sr.request_id for sr in sched.scheduled if sr.sample] + sched.decode_request_ids:
        request = requests[request_id]
        if len(request.output_token_ids) + request.num_output_placeholders + 1 < request.sampling_params.max_tokens:
            request.num_output_placeholders += 1
