"""What the engine returns for a request after a step (vLLM's ``RequestOutput``)."""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(slots=True)
class RequestOutput:
    """A request's progress after one engine step: the new tokens and text, or how it ended."""

    request_id: str
    """The id given to ``add_request``."""
    prompt_token_ids: list[int]
    """The prompt's tokens."""
    new_token_ids: list[int]
    """Tokens generated in this step (usually one; empty on an abort or error)."""
    output_token_ids: list[int]
    """All tokens generated so far."""
    delta_text: str = ""
    """Text that became final in this step (empty without a tokenizer)."""
    text: str = ""
    """All final text so far (a matched stop string is not included)."""
    finished: bool = False
    """True on the request's last output."""
    finish_reason: str | None = None
    """"stop" (EOS, stop token or stop string), "length", "abort" or "error"; None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the request, if one did."""
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache when the request was first scheduled."""
    error: str | None = None
    """What went wrong, when ``finish_reason == "error"``."""
    metrics: RequestMetrics | None = field(default=None)
    """Timing of the request."""
    new_logprobs: list[TokenLogprobs] | None = None
    """Logprobs of ``new_token_ids`` (when the request asked for ``logprobs``)."""
    logprobs: list[TokenLogprobs] | None = None
    """Logprobs of every output token, on the final output only (when asked)."""
    prompt_logprobs: PromptLogprobs | None = None
    """Logprobs of the prompt tokens (when asked), from the first output that carries a token on."""

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the output tokens' logprobs (final output of a request with ``logprobs``), else None."""
        return None if self.logprobs is None else sum(lp.logprob for lp in self.logprobs)


class ModelRunnerOutput(dict):
    """What a model runner returns for a step: ``{request_id: sampled token}`` (a plain dict to every
    caller that wants only tokens) plus the logprobs the step's requests asked for.

    ``logprobs``: request_id -> logprobs of its sampled token (requests with ``logprobs`` set).
    ``prompt_logprobs``: request_id -> [(prompt position, logprobs of the prompt token there)] computed
    this step (requests with ``prompt_logprobs`` set, one entry per prompt position of the chunk).
    """

    __slots__ = ("logprobs", "prompt_logprobs")

    def __init__(self, sampled: dict[str, int], logprobs: dict[str, TokenLogprobs] | None = None,
                 prompt_logprobs: dict[str, list[tuple[int, TokenLogprobs]]] | None = None) -> None:
        super().__init__(sampled)
        self.logprobs = logprobs or {}
        self.prompt_logprobs = prompt_logprobs or {}

    def __reduce__(self):  # pickled across Ray (tensor-parallel rank 0 -> the engine)
        return ModelRunnerOutput, (dict(self), self.logprobs, self.prompt_logprobs)
