"""What the engine checks of a request before it queues it (validate at the edge): each error says what is wrong
and how to send it right; a ``SamplingParamsError`` names the field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvmesh.replica.serving.sampling_params import SamplingParams, context_overflow
from kvmesh.replica.serving.sampling_params_error import SamplingParamsError

if TYPE_CHECKING:
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.engine.engine_request import EngineRequest
    from kvmesh.replica.engine.scheduler import Scheduler
    from kvmesh.replica.engine.structured_output import StructuredOutputManager
    from kvmesh.replica.serving.hf_tokenizer import HFTokenizer


class EngineLimits(Protocol):
    """What ``check_request`` reads of the engine (``LLMEngine``)."""

    config: EngineConfig
    scheduler: Scheduler
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    tokenizer: HFTokenizer | None
    structured_output: StructuredOutputManager


def check_request(request: EngineRequest, engine: EngineLimits) -> None:
    """Raise ValueError for a request ``engine`` cannot queue (nothing is queued then)."""
    request_id, params = request.request_id, request.sampling_params
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    if request_id in engine.scheduler.requests:
        raise ValueError(f"request id {request_id!r} is already in use; use a unique id per request")
    if request.cache_salt is not None and not isinstance(request.cache_salt, str):
        raise ValueError(f"cache_salt must be a string or None, got {type(request.cache_salt).__name__}")
    check_priority(request.priority, engine.config.scheduling_policy)
    validate_request_input(
        request.prompt_token_ids, params, max_model_len=engine.max_model_len, vocab_size=engine.vocab_size,
        block_size=engine.config.block_size, num_usable_blocks=engine.num_kv_blocks - 1,
        has_tokenizer=engine.tokenizer is not None)
    if params.structured_outputs is not None:  # errors name the field
        engine.structured_output.check(params.structured_outputs, len(request.prompt_token_ids))

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
    if params.largest_token_id >= vocab_size:  # known since validate: an n child's shared lists are not walked
        _raise_outside_vocabulary(params, vocab_size)
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer, and this engine has none; use stop_token_ids")


def _raise_outside_vocabulary(params: SamplingParams, vocab_size: int) -> None:
    """Raise SamplingParamsError naming the first token list with an id outside the vocabulary."""
    for name, token_ids in (("logit_bias", params.logit_bias or {}),
                            ("allowed_token_ids", params.allowed_token_ids or []),
                            ("stop_token_ids", params.stop_token_ids or [])):  # min_tokens bans stop ids: in range
        if (bad := next((t for t in token_ids if t >= vocab_size), None)) is not None:
            raise SamplingParamsError(name, f"{name} has token id {bad}, outside the vocabulary [0, {vocab_size})")


def check_priority(priority: object, scheduling_policy: str) -> None:
    """Raise ValueError for a priority this engine cannot honour (vLLM's rule: non-zero needs the "priority"
    scheduling policy)."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    if priority != 0 and scheduling_policy != "priority":
        raise ValueError(f"got priority {priority} but priority scheduling is not enabled on this replica "
                         f"(scheduling_policy={scheduling_policy!r}); send priority 0, or start the replica with "
                         "--scheduling-policy priority")
