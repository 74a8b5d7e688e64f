"""The engine loop of one replica: requests in, scheduled steps through the model runner, outputs out.

    add_request ──▶ Scheduler ──SchedulerOutput──▶ ModelRunner.execute_model ──{request_id: token}──┐
                      ▲  KVCacheManager (blocks, prefix cache, events)                             │
    step() ◀── RequestOutput ◀── OutputProcessor: stop checks + incremental detokenization ◀────────┘

With ``EngineConfig.async_scheduling`` step() launches step N+1 before it reads step N's tokens
(async_scheduling.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.grammar_refusals import constraint_field, explain_refusal
from kvmesh.replica.engine.kv_connector import KVConnectorFactory
from kvmesh.replica.engine.loras import EngineLoRAs
from kvmesh.replica.engine.output_processor import OutputProcessor
from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.engine.request_checks import check_request
from kvmesh.replica.engine.scheduler import Scheduler
from kvmesh.replica.engine.setup import (
    load_engine_tokenizer,
    make_engine_drafter,
    make_event_publisher,
    make_kv_cache_manager,
    make_kv_connectors,
)
from kvmesh.replica.engine.stats import EngineStats
from kvmesh.replica.engine.step_launcher import StepLauncher
from kvmesh.replica.engine.structured_output import StructuredOutputManager
from kvmesh.replica.interfaces import EventPublisher, ModelRunnerInterface
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.spec_decode.drafting import accept_drafts
from kvmesh.replica.step.outputs import ModelRunnerOutput, RequestOutput
from kvmesh.replica.step.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from kvmesh.events.config import PublisherConfig
    from kvmesh.replica.engine.async_scheduling import LaunchedStep
    from kvmesh.replica.engine.engine_request import EngineRequest

logger = logging.getLogger(__name__)
C = TypeVar("C")


class LLMEngine:
    """Single-threaded engine: call ``add_request`` / ``abort_request`` and ``step()`` from one thread."""

    def __init__(self, config: EngineConfig, model_runner: ModelRunnerInterface | None = None,
                 tokenizer: HFTokenizer | None = None, event_publisher: EventPublisher | None = None,
                 skip_tokenizer_init: bool = False, events: PublisherConfig | None = None,
                 kv_connectors: Sequence[KVConnectorFactory] | None = None) -> None:
        """``events`` (the events section whole) makes the engine build its KV event publisher
        (``event_publisher`` gives a ready one instead); neither: no events. ``kv_connectors`` build the
        connectors of KV held or moved outside the block tables (kv_connector.py; None: ``default_kv_connectors``);
        the host tier's comes first when the cache has one."""
        self.config = config
        if model_runner is None:
            from kvmesh.replica.executor.factory import local_model_runner

            model_runner = local_model_runner(config)
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
            self._step_events.append if event_publisher is not None or events is not None else None,
            held_elsewhere=lambda: self.kv_connectors.held_blocks())
        if event_publisher is None and events is not None:
            self.event_publisher = make_event_publisher(events, self.kv_cache_manager.snapshot_events)
        self.scheduler = Scheduler(config, self.kv_cache_manager)
        self.scheduler.drafter = make_engine_drafter(  # speculative decoding (spec_decode/)
            config, self.vocab_size, self.max_model_len, self.num_kv_blocks, lambda: self.scheduler.running)
        self._pending: list[RequestOutput] = []  # outputs of aborts between steps
        self._stats = EngineStats.for_model(self.max_model_len)
        self.output_processor = OutputProcessor(self.tokenizer, self._stats, type(model_runner).__name__)
        self.steps = StepLauncher(config, model_runner, self._stats)  # runs steps, learns their times
        self.prefill_rate, self.decode_step_time = self.steps.prefill_rate, self.steps.decode_step_time
        # the engine thread polls them between steps and reads their /load fields
        self.kv_connectors = make_kv_connectors(config, self.kv_cache_manager, model_runner, kv_connectors)
        self.scheduler.connector = self.kv_connectors
        self.loras = EngineLoRAs(config, model_runner)  # adapters known here; config.lora_modules registered now
        self.structured_output = StructuredOutputManager(self.tokenizer, self.vocab_size, self.eos_token_ids,
                                                         config.structured_outputs)
        """Grammars of the requests with structured outputs (structured_output.py)."""

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register an adapter (read and checked now); False when it was registered already. Raises ValueError."""
        return self.loras.add(lora_request)

    def remove_lora(self, lora_name: str) -> bool:
        """Forget an adapter (running requests finish with its weights); False when unknown."""
        return self.loras.remove(lora_name, self.scheduler.requests.values())

    def list_loras(self) -> list[LoRARequest]:
        return list(self.loras.registered.values())  # a copy: the HTTP side reads it off the engine thread

    # -- requests ----------------------------------------------------------------------------------

    def add_request(self, engine_request: EngineRequest) -> None:
        """Queue ``engine_request``, held unchanged by its ``Request``; ValueError (nothing queued) for bad input."""
        check_request(engine_request, self)
        params = engine_request.sampling_params
        request = Request(engine_request, self.eos_token_ids, self.loras.resolve(engine_request.lora_request))
        self.output_processor.add_request(request, params)
        self._stats.num_prompt_tokens += request.num_prompt_tokens
        if params.structured_outputs is not None:
            self.structured_output.add_request(request, params.structured_outputs)
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str | list[str]) -> None:
        """End requests now (unknown or finished ids are ignored); their final outputs come with the next step."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self._finish_with(rid, RequestStatus.FINISHED_ABORTED)

    def fail_request(self, request_id: str, error: str, param: str | None = None) -> None:
        """End one request with finish_reason "error" (the engine keeps serving the others); ``param``: the request
        field that caused it (None: the engine's own failure; grammar_refusals.py)."""
        self._finish_with(request_id, RequestStatus.FINISHED_ERROR, error, param)

    def _finish_with(self, request_id: str, status: RequestStatus, error: str | None = None,
                     param: str | None = None) -> None:
        request = self.scheduler.finish_request(request_id, status)
        self.structured_output.finish(request_id)
        if request is not None:
            params = self.kv_connectors.request_finished(request)  # aborted or failed: an empty lease, if asked
            request.error, request.error_param = error, param
            self._pending.append(out := self.output_processor.make_output(request, []))
            out.kv_lease = params
            self.output_processor.on_finished(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending) or self.steps.in_flight is not None

    @property
    def waits_only_for_remote_kvs(self) -> bool:
        """The last step ran nothing: every unfinished request waits for KV from another replica (the engine
        thread may sleep until a connector wakes it)."""
        return self.scheduler.waits_only_for_remote and not self._pending and self.steps.in_flight is None

    @property
    def waits_only_for_grammars(self) -> bool:
        """Every unfinished request waits for its grammar to compile: a step would do nothing (the engine thread
        may sleep until a compile ends, ``StructuredOutputManager.on_compiled``)."""
        waiting = self.structured_output.num_compiling
        return 0 < waiting == len(self.scheduler.requests) and not self._pending and self.steps.in_flight is None

    @property
    def async_scheduling(self) -> bool:
        """Whether step() launches a step before it reads the last one's tokens (async_scheduling.py)."""
        return self.steps.async_scheduling

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # -- one step ----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, and return the outputs of every request that progressed or ended
        (with async scheduling: launch this step, then return the outputs of the previous one)."""
        outputs, self._pending = self._pending, []
        self.kv_connectors.update_connector_output()
        if self.structured_output.live:
            for request_id, error in self.structured_output.poll():  # compile failures: the request's constraint
                self.fail_request(request_id, error, constraint_field(self.structured_output, request_id))
            outputs, self._pending = outputs + self._pending, []
        sched = self.scheduler.schedule()
        launched = None
        if sched.is_empty:
            self.scheduler.finished_request_ids |= sched.finished_request_ids  # tell the runner next time
        else:
            sched.grammar_bitmask = self.structured_output.grammar_bitmask(sched)
            launched = self._launch(sched, outputs)
        if (ready := self.steps.ready(launched)) is not None:
            outputs += self._process_step(self._read(ready, outputs))
        self._end_step()
        return outputs

    def _launch(self, sched: SchedulerOutput, outputs: list[RequestOutput]) -> LaunchedStep | None:
        """Run the step (step_launcher.py). A runner failure fails the step's requests into ``outputs`` and the
        engine keeps serving the others."""
        try:
            return self.steps.launch(sched, self.scheduler.requests)
        except Exception as e:
            outputs += self._fail_step(sched, e)
            return None

    def _read(self, step: LaunchedStep, outputs: list[RequestOutput]) -> dict[str, int]:
        """The step's sampled tokens ({} if the runner failed it: its requests fail into ``outputs``)."""
        try:
            return self.steps.read(step, self.scheduler.requests)
        except Exception as e:
            outputs += self._fail_step(step.sched, e)
            return {}

    def _fail_step(self, sched: SchedulerOutput, error: Exception) -> list[RequestOutput]:
        """The runner failed a batch: fail its requests (the engine keeps serving the others)."""
        logger.exception("model runner failed a step of %d requests", sched.num_requests)
        if sched.offload_copies is not None:
            self.kv_cache_manager.cancel_offload_copies([sched.offload_copies.job_id])
        for request_id in sched.request_ids():
            self.fail_request(request_id, f"model runner error: {error!r}")
        # Blocks are cached when scheduled; their K/V may never have been written: forget them.
        if not self.kv_cache_manager.reset_prefix_cache():
            logger.warning("prefix cache not reset after a runner failure: other requests hold blocks")
        failed, self._pending = self._pending, []
        return failed

    def _end_step(self) -> None:
        if self.loras.retired:  # an adapter's old weights, kept while requests ran with them
            self.loras.drop_retired(self.scheduler.requests.values())
        self._publish_events()
        if self.config.debug_check_integrity:
            self.kv_cache_manager.check_integrity()

    def _process_step(self, sampled: dict[str, int]) -> list[RequestOutput]:
        """The step's outputs; a request whose drafts were accepted appends its tokens one at a time."""
        if not (isinstance(sampled, ModelRunnerOutput) and sampled.draft_targets):
            return self._process_sampled(sampled)
        later = accept_drafts(self.scheduler.drafter, sampled, self.scheduler.requests)
        outputs = self._process_sampled(sampled)
        for tokens in later:  # requests that ended on an earlier token drop the rest
            outputs += self._process_sampled({r: t for r, t in tokens.items() if r in self.scheduler.requests})
        return outputs

    def _process_sampled(self, sampled: dict[str, int]) -> list[RequestOutput]:
        """The step's outputs (output_processor.py), its finished requests freed, then the aborts it caused."""
        if self.structured_output.live:  # the matchers move first: a complete grammar stops its request
            for request_id, error in self.structured_output.accept(sampled):
                self.fail_request(request_id, *explain_refusal(self.structured_output,
                                                               self.scheduler.requests[request_id], error))
                del sampled[request_id]
        outputs, finished = self.output_processor.process_outputs(sampled, self.scheduler.requests,
                                                                  self.fail_request)
        for request in finished:  # before the blocks are freed: a lease taken here holds them
            if (params := self.kv_connectors.request_finished(request)) is not None:
                next(o for o in outputs if o.request_id == request.request_id and o.finished).kv_lease = params
            self.structured_output.finish(request.request_id)
        self.scheduler.finish_running(finished)
        for request in finished:
            self.output_processor.on_finished(request)
        outputs += self._pending
        self._pending = []
        return outputs

    def connector(self, kind: type[C]) -> C | None:
        """This engine's connector of class ``kind`` (None without one; kv_connectors.py)."""
        return self.kv_connectors.get(kind)

    # -- events, stats, lifecycle ------------------------------------------------------------------

    def _publish_events(self) -> None:
        """Send the KV events of this step as one batch (none are sent for a step without events)."""
        if self._step_events:
            events, self._step_events[:] = list(self._step_events), []
            if self.event_publisher is not None:
                self.event_publisher.publish(events)

    def get_stats(self) -> EngineStats:
        """The live stats object, its gauges refreshed (counters and histograms are cumulative)."""
        stats = self._stats.refresh(self.scheduler, self.kv_cache_manager, self.prefill_rate.tokens_per_s,
                                    self.model_runner.kv_offload, self.config.block_size)
        stats.grammar_compiles = self.structured_output.compile_stats()
        return stats

    @property
    def stats(self) -> EngineStats:
        return self.get_stats()

    def reset_prefix_cache(self) -> bool:
        """Forget the whole cache (AllBlocksCleared, sent now); False (nothing done) while a request holds blocks.
        Between steps only (the engine thread)."""
        done = self.kv_cache_manager.reset_prefix_cache()
        self._publish_events()
        return done

    def reset_unreferenced(self) -> int:
        """``POST /reset_prefix_cache``: every cached block no request holds stops being cached, its events sent
        now (kvcache ``reset_unreferenced``); how many. Between steps only (the engine thread)."""
        num_freed = self.kv_cache_manager.reset_unreferenced()
        self._publish_events()
        return num_freed

    def close(self) -> None:
        self.structured_output.close()
        if self.event_publisher is not None:
            self.event_publisher.close()
            self.event_publisher = None

