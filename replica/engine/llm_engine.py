"""The engine loop of one replica: requests in, scheduled steps through the model runner, outputs out.

    add_request ──▶ Scheduler ──SchedulerOutput──▶ ModelRunner.execute_model ──{request_id: token}──┐
                      ▲  KVCacheManager (blocks, prefix cache, events)                             │
    step() ◀── RequestOutput ◀── stop checks + incremental detokenization ◀────────────────────────┘

With ``EngineConfig.async_scheduling`` step() launches step N+1 before it reads step N's tokens
(async_scheduling.py).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.async_scheduling import LaunchedStep, add_placeholders, use_async_scheduling
from kvmesh.replica.engine.outputs import ModelRunnerOutput, RequestOutput, TokenLogprobs, request_output
from kvmesh.replica.engine.prefill_rate import PrefillRate
from kvmesh.replica.engine.request import Request, RequestStatus, validate_request_input
from kvmesh.replica.engine.scheduler import Scheduler
from kvmesh.replica.engine.scheduler_output import SchedulerOutput
from kvmesh.replica.engine.setup import load_engine_tokenizer, make_event_publisher, make_kv_cache_manager
from kvmesh.replica.engine.stats import EngineStats
from kvmesh.replica.interfaces import AsyncModelRunner, EventPublisher, ModelRunnerInterface
from kvmesh.replica.serving.detokenizer import IncrementalDetokenizer
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvmesh.events.config import PublisherConfig

logger = logging.getLogger(__name__)


class LLMEngine:
    """Single-threaded engine: call ``add_request`` / ``abort_request`` and ``step()`` from one thread."""

    def __init__(self, config: EngineConfig, model_runner: ModelRunnerInterface | None = None,
                 tokenizer: HFTokenizer | None = None, event_publisher: EventPublisher | None = None,
                 skip_tokenizer_init: bool = False, events: PublisherConfig | None = None) -> None:
        """``events`` (the events section whole) makes the engine build its KV event publisher
        (``event_publisher`` gives a ready one instead); neither: no events."""
        self.config = config
        if model_runner is None:
            from kvmesh.replica.worker.model_runner import ModelRunner

            model_runner = ModelRunner(config)
        self.model_runner = model_runner
        self.max_model_len: int = model_runner.max_model_len
        self.vocab_size: int = model_runner.vocab_size
        self.eos_token_ids = frozenset(model_runner.eos_token_ids or ())
        self.num_kv_blocks = min(model_runner.num_kv_blocks, config.num_kv_blocks or model_runner.num_kv_blocks)
        self.tokenizer = tokenizer if tokenizer is not None or skip_tokenizer_init else load_engine_tokenizer(config)
        self.event_publisher = event_publisher
        self._step_events: list = []
        self.kv_cache_manager = make_kv_cache_manager(
            config, self.num_kv_blocks, model_runner.num_host_blocks,
            self._step_events.append if event_publisher is not None or events is not None else None)
        if event_publisher is None and events is not None:
            self.event_publisher = make_event_publisher(events, self.kv_cache_manager.snapshot_events)
        self.scheduler = Scheduler(config, self.kv_cache_manager)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._pending: list[RequestOutput] = []  # outputs of aborts between steps
        self.async_scheduling = use_async_scheduling(config, model_runner)
        self._in_flight: LaunchedStep | None = None  # async scheduling: step N, launched, tokens not read yet
        self._stats = EngineStats.for_model(self.max_model_len)
        self.prefill_rate = PrefillRate()
        """Prompt tokens per second this engine computes, from its own steps (reported in ``/load``)."""

    # -- requests ----------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams | None = None,
                    cache_salt: str | None = None, arrival_time: float | None = None) -> None:
        """Queue a request. Raises ValueError (and queues nothing) when the input is invalid."""
        params = SamplingParams() if sampling_params is None else sampling_params
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already in use; use a unique id per request")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt must be a string or None, got {type(cache_salt).__name__}")
        validate_request_input(
            prompt_token_ids, params, max_model_len=self.max_model_len, vocab_size=self.vocab_size,
            block_size=self.config.block_size, num_usable_blocks=self.num_kv_blocks - 1,
            has_tokenizer=self.tokenizer is not None)
        request = Request(request_id, prompt_token_ids, params, self.eos_token_ids, cache_salt,
                          arrival_time=arrival_time)
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params)
        self._stats.num_prompt_tokens += request.num_prompt_tokens
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str | list[str]) -> None:
        """End requests now (unknown or finished ids are ignored); their final outputs come with the next step."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self._finish_with(rid, RequestStatus.FINISHED_ABORTED)

    def fail_request(self, request_id: str, error: str) -> None:
        """End one request with finish_reason "error" (the engine keeps serving the others)."""
        self._finish_with(request_id, RequestStatus.FINISHED_ERROR, error)

    def _finish_with(self, request_id: str, status: RequestStatus, error: str | None = None) -> None:
        request = self.scheduler.finish_request(request_id, status)
        if request is not None:
            request.error = error
            self._pending.append(self._make_output(request, []))
            self._on_finished(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending) or self._in_flight is not None

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # -- one step ----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, and return the outputs of every request that progressed or ended
        (with async scheduling: launch this step, then return the outputs of the previous one)."""
        outputs, self._pending = self._pending, []
        self.poll_kv_transfers()
        sched = self.scheduler.schedule()
        launched = None
        if sched.is_empty:
            self.scheduler.finished_request_ids |= sched.finished_request_ids  # tell the runner next time
        else:
            launched = self._launch(sched, outputs)
        ready = launched
        if self.async_scheduling:
            ready, self._in_flight = self._in_flight, launched
        if ready is not None:
            outputs += self._process_sampled(self._read(ready, outputs))
        self._end_step()
        return outputs

    def _launch(self, sched: SchedulerOutput, outputs: list[RequestOutput]) -> LaunchedStep | None:
        """Run the step (async scheduling: launch it; its tokens are read one step later). A runner failure
        fails the step's requests into ``outputs`` and the engine keeps serving the others."""
        try:
            start = time.monotonic()
            if self.async_scheduling:
                requests = self.scheduler.requests
                runner: AsyncModelRunner = self.model_runner  # use_async_scheduling saw it launch steps
                launched = LaunchedStep(sched, runner.execute_model_async(sched),
                                        {rid: requests[rid] for rid in sched.request_ids()}, start)
                add_placeholders(requests, sched)
            else:
                launched = LaunchedStep(sched, self.model_runner.execute_model(sched), None, start)
            self._stats.record_step(sched.num_batched_tokens)
            return launched
        except Exception as e:
            outputs += self._fail_step(sched, e)
            return None

    def _read(self, step: LaunchedStep, outputs: list[RequestOutput]) -> dict[str, int]:
        """The step's sampled tokens ({} if the runner failed it: its requests fail into ``outputs``)."""
        try:
            sampled = step.sampled(self.scheduler.requests)
            if step.sched.scheduled:  # prompt tokens ran in it: launch to tokens read is its time
                self.prefill_rate.record(step.sched.num_batched_tokens, time.monotonic() - step.launched_at)
            return sampled
        except Exception as e:
            outputs += self._fail_step(step.sched, e)
            return {}

    def _fail_step(self, sched: SchedulerOutput, error: Exception) -> list[RequestOutput]:
        """The runner failed a batch: fail its requests (the engine keeps serving the others)."""
        logger.exception("model runner failed a step of %d requests", sched.num_requests)
        if sched.kv_transfers is not None:
            self.kv_cache_manager.cancel_transfers([sched.kv_transfers.transfer_id])
        for request_id in sched.request_ids():
            self.fail_request(request_id, f"model runner error: {error!r}")
        # Blocks are cached when scheduled; their K/V may never have been written: forget them.
        if not self.kv_cache_manager.reset_prefix_cache():
            logger.warning("prefix cache not reset after a runner failure: other requests hold blocks")
        failed, self._pending = self._pending, []
        return failed

    def poll_kv_transfers(self) -> None:
        """Copies to the host tier that landed become findable there (never waits for one)."""
        if self.kv_cache_manager.offload is not None:
            self.kv_cache_manager.complete_transfers(self.model_runner.finished_kv_transfers())

    def _end_step(self) -> None:
        self._publish_events()
        if self.config.debug_check_integrity:
            self.kv_cache_manager.check_integrity()

    def _process_sampled(self, sampled: dict[str, int]) -> list[RequestOutput]:
        """Append each sampled token, run the stop checks, build the outputs (the per-token hot path: a
        decoding request without text to decode and not at a stop condition skips the general path)."""
        now = time.monotonic()
        outputs: list[RequestOutput] = []
        finished: list[Request] = []
        requests, detokenizers = self.scheduler.requests, self._detokenizers
        append_token, append_output = self._append_token, outputs.append
        tpots: dict[float, int] = {}  # inter-token time -> requests (observed once per distinct value)
        with_logprobs = isinstance(sampled, ModelRunnerOutput)  # when a request asked for logprobs
        token_logprobs = sampled.logprobs if with_logprobs else None
        if with_logprobs and sampled.prompt_logprobs:
            self._record_prompt_logprobs(sampled.prompt_logprobs)
        for request_id, token in sampled.items():
            request = requests.get(request_id)
            if request is None:
                continue
            output_ids = request.output_token_ids
            last = request.last_token_time
            if last is not None and not detokenizers and request.logprobs is None and request.prompt_logprobs is None:
                request.last_token_time = now
                tpots[now - last] = tpots.get(now - last, 0) + 1
                output_ids.append(token)
                request.all_token_ids.append(token)
                request.num_output_placeholders = max(0, request.num_output_placeholders - 1)  # async: arrived
                if request.check_stop():
                    finished.append(request)
                    append_output(self._make_output(request, [token]))
                else:
                    append_output(RequestOutput(request_id, request.prompt_token_ids, [token], output_ids, "",
                                                "", False, None, None, request.num_cached_tokens))
                continue
            try:
                if request.logprobs is not None:
                    if not token_logprobs or request_id not in token_logprobs:
                        raise RuntimeError(f"the model runner ({type(self.model_runner).__name__}) returned no "
                                           "logprobs for a request that asked for them")
                    request.logprobs.append(token_logprobs[request_id])
                done = append_token(request, token, now)
                append_output(self._make_output(request, [token]))
            except Exception as e:  # e.g. a tokenizer failure: only this request fails
                logger.exception("request %s failed while processing its output", request_id)
                self.fail_request(request_id, f"output processing error: {e!r}")
                continue
            if done:
                finished.append(request)
        for tpot, n in tpots.items():
            self._stats.tpot.observe_many(tpot, n)
        self._stats.num_generation_tokens += len(sampled)
        self.scheduler.finish_running(finished)
        for request in finished:
            self._on_finished(request)
        outputs += self._pending
        self._pending = []
        return outputs

    def _append_token(self, request: Request, token: int, now: float) -> bool:
        """Add a sampled token and run every stop rule; True when it ended the request (status set)."""
        if request.first_token_time is None:
            request.first_token_time = now
            self._stats.ttft.observe(now - request.arrival_time)
        else:
            self._stats.tpot.observe(now - request.last_token_time)
        request.last_token_time = now
        request.output_token_ids.append(token)
        request.all_token_ids.append(token)
        request.num_output_placeholders = max(0, request.num_output_placeholders - 1)  # async: it arrived
        if self._detokenizers:
            detok = self._detokenizers.get(request.request_id)
            if detok is not None and (stop_str := detok.update(token)) is not None:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = stop_str
                return True
        return request.check_stop()

    def _record_prompt_logprobs(self, computed: dict[str, list[tuple[int, TokenLogprobs]]]) -> None:
        """Store the prompt logprobs of this step's prefill chunks at their prompt positions."""
        for request_id, entries in computed.items():
            request = self.scheduler.requests.get(request_id)
            if request is not None and request.prompt_logprobs is not None:
                for position, entry in entries:
                    request.prompt_logprobs[position] = entry

    def _make_output(self, request: Request, new_token_ids: list[int]) -> RequestOutput:
        return request_output(request, new_token_ids, self._detokenizers.get(request.request_id))

    def _on_finished(self, request: Request) -> None:
        """Forget per-request state (the detokenizer is dropped after the final output was built)."""
        self._stats.record_finished(request)
        self._detokenizers.pop(request.request_id, None)

    # -- events, stats, lifecycle ------------------------------------------------------------------

    def _publish_events(self) -> None:
        """Send the KV events of this step as one batch (none are sent for a step without events)."""
        if not self._step_events:
            return
        events = list(self._step_events)
        self._step_events.clear()
        if self.event_publisher is not None:
            self.event_publisher.publish(events)

    def get_stats(self) -> EngineStats:
        """The live stats object, its gauges refreshed (counters and histograms are cumulative)."""
        stats = self._stats
        stats.num_running = self.scheduler.num_running
        stats.num_waiting = self.scheduler.num_waiting
        stats.kv_cache_usage = self.kv_cache_manager.usage
        cache_stats = self.kv_cache_manager.prefix_cache_stats
        stats.prefix_cache_queries = cache_stats.queries
        stats.prefix_cache_hits = cache_stats.hits
        stats.num_preemptions = self.scheduler.num_preemptions
        stats.prefill_tokens_per_s = self.prefill_rate.tokens_per_s or 0.0
        offload, copier = self.kv_cache_manager.offload, self.model_runner.kv_offload
        if offload is not None and copier is not None:
            stats.num_host_kv_blocks = offload.host.num_blocks
            stats.host_kv_cache_usage = offload.host.usage()
            stats.host_prefix_cache_hits = offload.stats.hit_blocks * self.config.block_size
            stats.kv_offload_bytes_to_host = copier.bytes_stored
            stats.kv_offload_bytes_to_device = copier.bytes_loaded
            stats.kv_offload_load_seconds = copier.load_seconds
        return stats

    @property
    def stats(self) -> EngineStats:
        return self.get_stats()

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def close(self) -> None:
        if self.event_publisher is not None:
            self.event_publisher.close()
            self.event_publisher = None

