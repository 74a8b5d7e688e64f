"""One generation request as the engine tracks it: tokens, progress through the KV cache, status."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams, context_overflow
from kvmesh.replica.serving.sampling_params_error import SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.engine.remote_kv import PullResult, RemoteKV


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
        "request_id", "prompt_token_ids", "sampling_params", "cache_salt", "lora_name", "lora_identity", "lora_request", "eos_token_ids",
        "stop_token_ids",
        "all_token_ids", "output_token_ids", "num_computed_tokens", "block_ids", "num_cached_tokens", "num_host_cached_tokens", "status",
        "stop_reason", "error", "error_param", "num_preemptions", "arrival_time", "first_scheduled_time",
        "first_token_time", "last_token_time", "finished_time", "decoding_in_runner", "skip_reading_prefix_cache",
        "logprobs", "prompt_logprobs", "num_output_placeholders", "priority", "structured_output",
        "remote_kv", "kv_pull", "spec_token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: frozenset[int] = frozenset(),
        cache_salt: str | None = None,
        lora_name: str | None = None,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        remote_kv: RemoteKV | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.cache_salt = cache_salt
        self.lora_request = lora_request  # the adapter it runs with (None: the base model)
        self.lora_name = lora_request.lora_name if lora_request is not None else lora_name  # keys its blocks
        self.lora_identity = lora_request.identity if lora_request is not None else None  # ... with its weights'
        self.eos_token_ids = frozenset() if sampling_params.ignore_eos else eos_token_ids
        self.stop_token_ids = self.eos_token_ids | frozenset(sampling_params.stop_token_ids)  # any ends it
        self.all_token_ids: list[int] = list(prompt_token_ids)
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
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority  # lower runs first under the "priority" scheduling policy (vLLM's)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finished_time: float | None = None
        self.decoding_in_runner = False  # the runner sampled its newest token and holds its row (decode by id)
        # async scheduling: tokens sampled by launched steps that the host has not seen yet (not in all_token_ids)
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] | None = None  # drafts scheduled this step (spec_decode/); None: never looked
        self.structured_output = None  # its grammar and matcher (engine/structured_output.py); None: unconstrained
        self.remote_kv = remote_kv  # its kv_transfer_params: a pull before it runs, a lease at its finish (None: neither)
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


def validate_request_input(
    prompt_token_ids: list[int],
    params: SamplingParams,
    *,
    max_model_len: int,
    vocab_size: int,
    block_size: int,
    num_usable_blocks: int,
    has_tokenizer: bool,
) -> None:
    """Raise ValueError saying what is wrong with a request before it is queued (validate at the edge)."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
    try:
        params.validate()
    except TypeError as e:
        raise ValueError(f"invalid sampling parameters: {e}") from None
    n = len(prompt_token_ids)
    if n == 0:
        raise ValueError("prompt is empty; send at least one token")
    for pos, tok in enumerate(prompt_token_ids):
        if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < vocab_size:
            raise ValueError(f"prompt token {tok!r} at position {pos} is outside the vocabulary "
                             f"[0, {vocab_size}); send token ids of this model's tokenizer")
    if (overflow := context_overflow(n, params.max_tokens, max_model_len)) is not None:
        raise ValueError(f"{overflow} Shorten the {'prompt' if n >= max_model_len else 'prompt or max_tokens'}.")
    needed = n + params.max_tokens
    num_blocks = -(-needed // block_size)
    if num_blocks > num_usable_blocks:
        raise ValueError(f"request needs {num_blocks} KV blocks ({needed} tokens) but the KV cache holds only "
                         f"{num_usable_blocks}; shorten it or give the replica more KV cache memory")
    for name, token_ids in (("logit_bias", params.logit_bias or {}), ("allowed_token_ids", params.allowed_token_ids or []),
                            ("stop_token_ids", params.stop_token_ids or [])):  # min_tokens bans stop ids: in range
        if (bad := next((t for t in token_ids if t >= vocab_size), None)) is not None:
            raise SamplingParamsError(name, f"{name} has token id {bad}, outside the vocabulary [0, {vocab_size})")
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer, and this engine has none; use stop_token_ids")


def check_priority(priority: object, scheduling_policy: str) -> None:
    """Raise ValueError for a priority this engine cannot honour (vLLM's rule: non-zero needs the "priority"
    scheduling policy)."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if priority != 0 and scheduling_policy != "priority":
        raise ValueError(f"got priority {priority} but priority scheduling is not enabled on this replica "
                         f"(scheduling_policy={scheduling_policy!r}); send priority 0, or start the replica with "
                         "--scheduling-policy priority")
