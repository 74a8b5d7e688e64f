"""A step's sampled tokens become ``RequestOutput``s: each token appended, the stop rules run, the text
detokenized incrementally, the logprobs stored, TTFT and inter-token times observed (vLLM's
``OutputProcessor``). ``LLMEngine`` owns one and hands it every step's ``{request_id: token}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvmesh.replica.engine.request import Request, RequestStatus
from kvmesh.replica.engine.stats import EngineStats
from kvmesh.replica.serving.detokenizer import IncrementalDetokenizer
from kvmesh.replica.serving.hf_tokenizer import HFTokenizer
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.outputs import ModelRunnerOutput, RequestMetrics, RequestOutput, TokenLogprobs

logger = logging.getLogger(__name__)


class OutputProcessor:
    """The per-request output state (detokenizers) and the per-token hot path of one engine."""

    def __init__(self, tokenizer: HFTokenizer | None, stats: EngineStats, runner_name: str) -> None:
        self.tokenizer = tokenizer
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._stats = stats
        self._runner_name = runner_name
        """The model runner's class name, for the error of a step that lacks asked-for logprobs."""
        self.finish_listeners: list[Callable[[], None]] = []
        """Called (engine thread) as a request that left the scheduler is forgotten, finished, aborted or failed:
        the load the replica publishes changed (replica/server/load_publishing.py)."""

    def add_request(self, request: Request, params: SamplingParams) -> None:
        if self.tokenizer is not None:
            self.detokenizers[request.request_id] = IncrementalDetokenizer(
                self.tokenizer, request.prompt_token_ids, params)

    def make_output(self, request: Request, new_token_ids: list[int]) -> RequestOutput:
        return request_output(request, new_token_ids, self.detokenizers.get(request.request_id))

    def on_finished(self, request: Request) -> None:
        """Forget per-request state (the detokenizer is dropped after the final output was built)."""
        self._stats.record_finished(request)
        self.detokenizers.pop(request.request_id, None)
        for listener in self.finish_listeners:
            listener()

    def process_outputs(self, sampled: dict[str, int], requests: dict[str, Request],
                        fail_request: Callable[[str, str], None]) -> tuple[list[RequestOutput], list[Request]]:
        """Append each sampled token, run the stop checks, build the outputs; returns them and the requests
        that ended (a request whose output processing raised is failed through ``fail_request`` instead).
        The per-token hot path: a decoding request without text to decode and not at a stop condition
        skips the general path."""
        now = time.monotonic()
        outputs: list[RequestOutput] = []
        finished: list[Request] = []
        detokenizers = self.detokenizers
        append_token, append_output = self.append_token, outputs.append
        tpots: dict[float, int] = {}  # inter-token time -> requests (observed once per distinct value)
        with_logprobs = isinstance(sampled, ModelRunnerOutput)  # when a request asked for logprobs
        token_logprobs = sampled.logprobs if with_logprobs else None
        if with_logprobs and sampled.prompt_logprobs:
            self._record_prompt_logprobs(sampled.prompt_logprobs, requests)
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
                    append_output(self.make_output(request, [token]))
                else:
                    append_output(RequestOutput(request_id, request.prompt_token_ids, [token], output_ids, "",
                                                "", False, None, None, request.num_cached_tokens))
                continue
            try:
                if request.logprobs is not None:
                    if not token_logprobs or request_id not in token_logprobs:
                        raise RuntimeError(f"the model runner ({self._runner_name}) returned no "
                                           "logprobs for a request that asked for them")
                    request.logprobs.append(token_logprobs[request_id])
                done = append_token(request, token, now)
                append_output(self.make_output(request, [token]))
            except Exception as e:  # e.g. a tokenizer failure: only this request fails
                logger.exception("request %s failed while processing its output", request_id)
                fail_request(request_id, f"output processing error: {e!r}")
                continue
            if done:
                finished.append(request)
        for tpot, n in tpots.items():
            self._stats.tpot.observe_many(tpot, n)
        self._stats.num_generation_tokens += len(sampled)
        return outputs, finished

    def append_token(self, request: Request, token: int, now: float) -> bool:
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
        if self.detokenizers:
            detok = self.detokenizers.get(request.request_id)
            silent = request.newest_is_stop_token() and not request.sampling_params.include_stop_str_in_output
            if detok is not None and not silent and (stop_str := detok.update(token)) is not None:
                request.status = RequestStatus.FINISHED_STOPPED
                request.stop_reason = stop_str
                return True
        return request.check_stop()

    @staticmethod
    def _record_prompt_logprobs(computed: dict[str, list[tuple[int, TokenLogprobs]]],
                                requests: dict[str, Request]) -> None:
        """Store the prompt logprobs of this step's prefill chunks at their prompt positions."""
        for request_id, entries in computed.items():
            request = requests.get(request_id)
            if request is not None and request.prompt_logprobs is not None:
                for position, entry in entries:
                    request.prompt_logprobs[position] = entry


def request_output(request: Request, new_token_ids: list[int], detok: IncrementalDetokenizer | None) -> RequestOutput:
    """The output of ``request`` after a step that gave it ``new_token_ids`` (its text from ``detok``, if any)."""
    finished = request.status.is_finished
    logprobs = request.logprobs
    new_logprobs = logprobs[len(logprobs) - len(new_token_ids):] if logprobs is not None else None
    return RequestOutput(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        new_token_ids=new_token_ids,
        output_token_ids=request.output_token_ids,
        delta_text=detok.take_delta(finished) if detok is not None else "",
        text=detok.visible_text(finished) if detok is not None else "",
        finished=finished,
        finish_reason=request.status.finish_reason,
        stop_reason=request.stop_reason,
        num_cached_tokens=max(request.num_cached_tokens, 0),
        num_host_cached_tokens=request.num_host_cached_tokens,
        error=request.error,
        error_param=request.error_param,
        metrics=_metrics(request) if finished else None,
        new_logprobs=new_logprobs,
        logprobs=list(logprobs) if finished and logprobs is not None else None,
        # complete once a token was sampled (a preempted request keeps the first computation's)
        prompt_logprobs=request.prompt_logprobs if request.output_token_ids else None,
        kv_pull=request.kv_pull,
        grammar_compile_s=request.structured_output.compile_s if request.structured_output is not None else 0.0,
    )


def _metrics(request: Request) -> RequestMetrics:
    return RequestMetrics(
        arrival_time=request.arrival_time, first_scheduled_time=request.first_scheduled_time,
        first_token_time=request.first_token_time, last_token_time=request.last_token_time,
        finished_time=request.finished_time or time.monotonic(), num_preemptions=request.num_preemptions)
