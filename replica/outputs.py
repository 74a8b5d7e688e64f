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
