"""What a step returns: the runner's ``ModelRunnerOutput`` to the engine, and the engine's ``RequestOutput`` for a
request (vLLM's ``RequestOutput``; built by engine/output_processor.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class RequestMetrics:
    """Timestamps (``time.monotonic()`` seconds) of one request's life."""

    arrival_time: float
    """When the engine accepted the request."""
    first_scheduled_time: float | None = None
    """When it first ran."""
    first_token_time: float | None = None
    """When its first output token was sampled."""
    last_token_time: float | None = None
    """When its newest output token was sampled."""
    finished_time: float | None = None
    """When it finished (None while running)."""
    num_preemptions: int = 0
    """How often it was preempted and recomputed."""

    @property
    def ttft(self) -> float | None:
        """Time to first token in seconds."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities at one position (vLLM's ``dict[int, Logprob]`` as parallel lists).

    Entry 0 is the token actually there (sampled, or the prompt's), then the top-k in rank order; the
    token may appear twice when it is itself in the top-k (vLLM keeps the same order and duplicate).
    """

    token_ids: list[int]
    """[1 + k] token ids: the chosen token, then the k most likely."""
    logprobs: list[float]
    """[1 + k] their log-probabilities (raw model distribution, fp32)."""
    rank: int
    """Rank of the chosen token in the distribution (1 = most likely)."""

    @property
    def logprob(self) -> float:
        """The chosen token's log-probability."""
        return self.logprobs[0]


PromptLogprobs = list[TokenLogprobs | None]
"""One entry per prompt token; the first is None (nothing predicts it)."""


class RequestOutput:
    """A request's progress after one engine step: the new tokens and text, or how it ended.

    ``output_token_ids`` is read from the request's own token list, which only grows: the output
    keeps the list and its length at the step, and copies that prefix when read (building an output
    then costs the same at token 1 and at token 10,000).

        request_id          the id given to ``add_request``
        prompt_token_ids    the prompt's tokens
        new_token_ids       tokens generated in this step (usually one; empty on an abort or error)
        output_token_ids    all tokens generated so far
        delta_text / text   text that became final in this step / all final text so far (a matched stop
                            string is not included; empty without a tokenizer)
        finished            True on the request's last output
        finish_reason       "stop" (EOS, stop token or stop string), "length", "abort" or "error"; None while running
        stop_reason         the stop token id or stop string that ended the request, if one did
        num_cached_tokens   prompt tokens served from the prefix cache when the request was first scheduled
        num_host_cached_tokens  of those, loaded back from the host tier (None: the replica has none)
        error               what went wrong, when finish_reason == "error"
        error_param         the request field that made the engine fail it (a constraint it cannot go on
                            with: the request's error, answered as a 4xx / finish_reason "error"); None when
                            the engine itself failed it (the replica's error, a 500)
        metrics             timing of the request (on the final output)
        new_logprobs        logprobs of ``new_token_ids`` (when the request asked for ``logprobs``)
        logprobs            logprobs of every output token, on the final output only (when asked)
        prompt_logprobs     logprobs of the prompt tokens (when asked), from the first output that carries a
                            token on
        kv_pull             how the request's pull from a peer went (a ``PullResult``; its first and final
                            outputs), None without one
        grammar_compile_s   seconds a compile process spent on the grammar the request waited for (0.0: none)
        kv_lease            the prefill side's lease on its prompt's blocks, as the response's
                            ``kv_transfer_params`` handle (the final output of a request that asked one)
    """

    __slots__ = ("request_id", "prompt_token_ids", "new_token_ids", "_output_ids", "_num_output", "delta_text",
                 "text", "finished", "finish_reason", "stop_reason", "num_cached_tokens", "error", "metrics",
                 "new_logprobs", "logprobs", "prompt_logprobs", "num_host_cached_tokens", "kv_pull", "kv_lease",
                 "error_param",
                 "grammar_compile_s")

    def __init__(self, request_id: str, prompt_token_ids: list[int], new_token_ids: list[int],
                 output_token_ids: list[int], delta_text: str = "", text: str = "", finished: bool = False,
                 finish_reason: str | None = None, stop_reason: int | str | None = None, num_cached_tokens: int = 0,
                 error: str | None = None, metrics: RequestMetrics | None = None,
                 new_logprobs: list[TokenLogprobs] | None = None, logprobs: list[TokenLogprobs] | None = None,
                 prompt_logprobs: PromptLogprobs | None = None, num_host_cached_tokens: int | None = None,
                 kv_pull=None, kv_lease: dict | None = None, error_param: str | None = None,
                 grammar_compile_s: float = 0.0) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.new_token_ids = new_token_ids
        self._output_ids, self._num_output = output_token_ids, len(output_token_ids)
        self.delta_text = delta_text
        self.text = text
        self.finished = finished
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.num_cached_tokens = num_cached_tokens
        self.num_host_cached_tokens = num_host_cached_tokens
        self.error = error
        self.metrics = metrics
        self.new_logprobs = new_logprobs
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.kv_pull = kv_pull
        self.kv_lease = kv_lease
        self.grammar_compile_s = grammar_compile_s
        self.error_param = error_param

    @property
    def output_token_ids(self) -> list[int]:
        """All tokens generated up to this step (a fresh list)."""
        return self._output_ids[: self._num_output]

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the output tokens' logprobs (final output of a request with ``logprobs``), else None."""
        return None if self.logprobs is None else sum(lp.logprob for lp in self.logprobs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestOutput):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _COMPARED)

    __hash__ = None  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return (f"RequestOutput(request_id={self.request_id!r}, new_token_ids={self.new_token_ids}, "
                f"output_token_ids={self.output_token_ids}, text={self.text!r}, finished={self.finished}, "
                f"finish_reason={self.finish_reason!r}, error={self.error!r})")

    def __getstate__(self):
        return {k: getattr(self, k) for k in _COMPARED}

    def __setstate__(self, state):
        RequestOutput.__init__(self, **state)


_COMPARED = ("request_id", "prompt_token_ids", "new_token_ids", "output_token_ids", "delta_text", "text", "finished",
             "finish_reason", "stop_reason", "num_cached_tokens", "error", "metrics", "new_logprobs", "logprobs",
             "prompt_logprobs", "num_host_cached_tokens", "kv_pull", "kv_lease", "error_param")


class ModelRunnerOutput(dict):
    """What a model runner returns for a step: ``{request_id: sampled token}`` (a plain dict to every
    caller that wants only tokens) plus the logprobs the step's requests asked for.

    ``logprobs``: request_id -> logprobs of its sampled token (requests with ``logprobs`` set).
    ``prompt_logprobs``: request_id -> [(prompt position, logprobs of the prompt token there)] computed
    this step (requests with ``prompt_logprobs`` set, one entry per prompt position of the chunk).
    """

    __slots__ = ("logprobs", "prompt_logprobs", "draft_targets")

    def __init__(self, sampled: dict[str, int], logprobs: dict[str, TokenLogprobs] | None = None,
                 prompt_logprobs: dict[str, list[tuple[int, TokenLogprobs]]] | None = None,
                 draft_targets: dict[str, list[int]] | None = None) -> None:
        super().__init__(sampled)
        self.logprobs = logprobs or {}
        self.prompt_logprobs = prompt_logprobs or {}
        self.draft_targets = draft_targets or {}
        """request_id -> the target's argmax at each of its draft positions (requests with drafts)."""

    def __reduce__(self):  # pickled across Ray (tensor-parallel rank 0 -> the engine)
        return ModelRunnerOutput, (dict(self), self.logprobs, self.prompt_logprobs, self.draft_targets)


class AsyncModelRunnerOutput(Protocol):
    """A launched step's result (vLLM's ``AsyncModelRunnerOutput``; worker/async_output.py implements it)."""

    def get(self) -> dict[str, int] | ModelRunnerOutput:
        """Waits for the step's sampled ids; returns what ``execute_model`` would have."""
        ...
