"""One generation request as the engine tracks it: tokens, progress through the KV cache, status."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from kvmesh.replica.serving.lora_request import LoRARequest

if TYPE_CHECKING:
    from kvmesh.replica.engine.engine_request import EngineRequest
    from kvmesh.replica.engine.remote_kv import PullResult


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. Every status from FINISHED_STOPPED on is final."""

    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1  # its prompt's blocks read from another replica (scheduler.py)
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style finish reason of a final status, else None."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    """A request's tokens and progress.

        all_token_ids = [p0 p1 ... p(n-1) | o0 o1 ... ]      prompt | output so far
                         <- num_computed_tokens ->            K/V already in the cache
    """

    __slots__ = (
        "engine_request", "request_id", "prompt_token_ids", "sampling_params", "cache_salt", "lora_name",
        "lora_identity", "lora_request", "eos_token_ids",
        "stop_token_ids",
        "all_token_ids", "output_token_ids", "num_computed_tokens", "block_ids", "num_cached_tokens",
        "num_host_cached_tokens", "status",
        "stop_reason", "error", "error_param", "num_preemptions", "arrival_time", "first_scheduled_time",
        "first_token_time", "last_token_time", "finished_time", "decoding_in_runner", "skip_reading_prefix_cache",
        "logprobs", "prompt_logprobs", "num_output_placeholders", "priority", "structured_output",
        "remote_kv", "kv_pull", "spec_token_ids",
    )

    def __init__(self, engine_request: EngineRequest, eos_token_ids: frozenset[int] = frozenset(),
                 lora_request: LoRARequest | None = None) -> None:
        """``engine_request``: what its caller asked, held unchanged; ``lora_request``: its adapter as registered
        here (None: the one it names)."""
        self.engine_request = engine_request
        sampling_params = engine_request.sampling_params
        self.request_id = engine_request.request_id
        self.prompt_token_ids = list(engine_request.prompt_token_ids)
        self.sampling_params = sampling_params
        self.cache_salt = engine_request.cache_salt
        lora_request = engine_request.lora_request if lora_request is None else lora_request
        self.lora_request = lora_request  # the adapter it runs with (None: the base model)
        self.lora_name = lora_request.lora_name if lora_request is not None else None  # keys its blocks
        self.lora_identity = lora_request.identity if lora_request is not None else None  # ... with its weights'
        self.eos_token_ids = frozenset() if sampling_params.ignore_eos else eos_token_ids
        self.stop_token_ids = sampling_params.stop_set(self.eos_token_ids)  # any ends it; one set for n children
        self.all_token_ids: list[int] = list(engine_request.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []  # the block table, kept in step with the KV cache manager's
        self.num_cached_tokens = -1  # prompt tokens found in the prefix cache at first scheduling
        self.num_host_cached_tokens: int | None = None  # of those, loaded back from the host tier (None: no tier)
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.error: str | None = None
        self.error_param: str | None = None  # the request field that made the engine fail it (None: the engine's fault)
        self.num_preemptions = 0
        self.arrival_time = time.monotonic() if engine_request.arrival_time is None else engine_request.arrival_time
        self.priority = engine_request.priority  # lower runs first under the "priority" scheduling policy (vLLM's)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None
        self.decoding_in_runner = False  # the runner sampled its newest token and holds its row (decode by id)
        # async scheduling: tokens sampled by launched steps that the host has not seen yet (not in all_token_ids)
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] | None = None  # drafts scheduled this step (spec_decode/); None: never looked
        self.structured_output = None  # its grammar and matcher (engine/structured_output.py); None: unconstrained
        # its kv_transfer_params: a pull before it runs, a lease at its finish (None: neither)
        self.remote_kv = engine_request.remote_kv
        self.kv_pull: PullResult | None = None  # how its pull went, once it ended (kv_transfers.py)
        # A request asking prompt logprobs needs the logits of every prompt position: it computes its whole
        # prompt instead of reading the prefix cache (vLLM's rule); it still writes the cache for others.
        self.skip_reading_prefix_cache = sampling_params.prompt_logprobs is not None
        self.logprobs: list | None = [] if sampling_params.logprobs is not None else None  # [TokenLogprobs]
        # [TokenLogprobs | None] per prompt position, filled as prefill chunks run (position 0 stays None)
        self.prompt_logprobs: list | None = (
            [None] * len(self.prompt_token_ids) if sampling_params.prompt_logprobs is not None else None)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def newest_is_stop_token(self) -> bool:
        """Whether the newest output token is EOS or a stop token that may end the request (``min_tokens`` are
        out): its text is then not output unless ``include_stop_str_in_output`` (vLLM's rule)."""
        return (self.output_token_ids[-1] in self.stop_token_ids
                and len(self.output_token_ids) >= self.sampling_params.min_tokens)

    def check_stop(self) -> bool:
        """The stop rule on token ids, written once: set a final status when the newest token ends the request
        (EOS or a stop token once ``min_tokens`` are out, else ``max_tokens`` reached); True when it did.
        Stop strings need text: the detokenizer finds them (serving/detokenizer.py)."""
        token_id = self.output_token_ids[-1]
        num_output_tokens = len(self.output_token_ids)
        params = self.sampling_params
        if self.newest_is_stop_token():
            self.status = RequestStatus.FINISHED_STOPPED
            if token_id not in self.eos_token_ids:
                self.stop_reason = token_id
            return True
        if self.structured_output is not None and self.structured_output.is_terminated:
            self.status = RequestStatus.FINISHED_STOPPED  # its grammar is complete: nothing may follow
            return True
        if num_output_tokens >= params.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens}, computed={self.num_computed_tokens})")

