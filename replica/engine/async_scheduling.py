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
from kvmesh.replica.interfaces import AsyncModelRunner

if TYPE_CHECKING:
    from kvmesh.replica.engine.request import Request
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.step.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
    from kvmesh.replica.step.scheduler_output import SchedulerOutput


@dataclass(frozen=True, slots=True)
class LaunchedStep:
    """A step the model runner ran (synchronous) or launched on the device (async: tokens not read yet)."""

    sched: SchedulerOutput
    """What the step computes."""
    output: ModelRunnerOutput | AsyncModelRunnerOutput
    """Its sampled tokens: on the host, or (async) on the way there (``get()`` waits for them)."""
    requests: dict[str, Request] | None = None
    """Async: the step's Request objects; an id aborted and reused before ``get()`` must not get this step's
    token. None for a synchronous step, whose tokens are read before anything can change."""
    launched_at: float = 0.0
    """``time.monotonic()`` when the step was launched (the engine's prefill rate: launch to tokens read)."""
    adapter_load_s: float = 0.0
    """Seconds its launch spent writing LoRA adapters into device slots (not the step's compute: priced apart)."""

    def sampled(self, requests: dict[str, Request]) -> ModelRunnerOutput:
        """``{request_id: token}`` of the requests still live as they were at launch (waits, if async)."""
        if self.requests is None:
            return self.output
        sampled = self.output.get()
        for request_id in [rid for rid in sampled if requests.get(rid) is not self.requests[rid]]:
            del sampled[request_id]  # ended (and its id reused) while the step ran
        return sampled


def use_async_scheduling(config: EngineConfig, model_runner: ModelRunnerInterface) -> bool:
    """``config.async_scheduling``, or for None: on when the runner is on CUDA and can launch steps."""
    can = isinstance(model_runner, AsyncModelRunner)
    if config.async_scheduling and not can:
        raise ValueError(f"async_scheduling=True needs a model runner that launches steps without waiting; "
                         f"{type(model_runner).__name__} cannot (tensor_parallel_size > 1?): drop async_scheduling")
    if config.async_scheduling is None:  # speculative decoding verifies drafts between steps: synchronous
        return can and str(model_runner.device).startswith("cuda") and config.speculative_config is None
    return config.async_scheduling


def add_placeholders(requests: dict[str, Request], sched: SchedulerOutput) -> None:
    """Count the tokens a launched step samples, except a request's last by max_tokens (it ends then)."""
    for request_id in [sr.request_id for sr in sched.scheduled if sr.sample] + sched.decode_request_ids:
        request = requests[request_id]
        if len(request.output_token_ids) + request.num_output_placeholders + 1 < request.sampling_params.max_tokens:
            request.num_output_placeholders += 1
