"""The request fields completions and chat completions share, their types (strict JSON booleans and integers, a
bounded priority) and their one conversion to the engine's ``SamplingParams`` (``to_sampling_params``): the base of
both request models (protocol.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from kvmesh.replica.openai.compile_tenant import charged_tenant
from kvmesh.replica.openai.kv_transfer_params import KVTransferParams
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.openai.structured_fields import StructuredOutputFields
from kvmesh.replica.openai.vllm_extras import VLLMExtraFields
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.sampling_params import SamplingParams, SamplingParamsError, context_overflow
from kvmesh.replica.serving.structured_outputs import StructuredOutputsParams
from pydantic import Field

Flag = Annotated[bool, Field(strict=True)]
"""A JSON boolean: ``"yes"``, ``"true"`` or ``1`` are a 400 naming the field (vLLM's), not a silent True."""
Count = Annotated[int, Field(strict=True)]
"""A JSON integer (a count, a token id): ``"2"``, ``2.5`` or ``true`` are a 400 naming the field."""

PRIORITY_LIMIT = 2**31 - 1
"""A request's ``priority`` is in [-PRIORITY_LIMIT, PRIORITY_LIMIT] (a 400 naming the field otherwise); vLLM takes any
int, this bound keeps a priority a small number everywhere it goes (the router's queue, metrics, the engine)."""
Priority = Annotated[int, Field(strict=True, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)]
MAX_CHOICES = 128
"""Most sequences (prompts x max(n, best_of)) one request may ask for (OpenAI's limit on n)."""


class StreamOptions(OpenAIBaseModel):
    include_usage: Flag = False
    """Send a last chunk (empty choices) with the request's usage before ``[DONE]``."""
    continuous_usage_stats: Flag = False
    """Attach the running usage to every chunk."""


class SamplingFields(StructuredOutputFields, VLLMExtraFields):
    """Fields shared by completions and chat completions (vLLM's extras: vllm_extras.py; the output's constraint:
    structured_fields.py)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Count | None = None
    min_tokens: Count = 0
    seed: Count | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Count] | None = None
    ignore_eos: Flag = False
    stream: Flag = False
    stream_options: StreamOptions | None = None
    n: Count = 1
    """Choices to return (each sampled independently; they share the prompt's KV blocks via the prefix cache)."""
    user: str | None = None
    cache_salt: str | None = None
    """Tenant isolation (vLLM): requests with different salts share no cached blocks."""
    request_id: str | None = None
    return_token_ids: Flag = False
    """(vLLM) Streamed chunks carry the token ids behind their text: each choice its new ``token_ids``, the
    first chunk the ``prompt_token_ids``. The router asks for them so a stream can migrate
    (router/http/migration.py)."""
    logit_bias: dict[str, float] | None = None
    """Token id (as a string key, as OpenAI sends it) -> bias in [-100, 100] added to its logit."""
    kv_transfer_params: KVTransferParams | None = None
    """(vLLM's NixlConnector) Move the prompt's KV between replicas (openai/kv_transfer_params.py)."""
    priority: Priority = 0
    """(vLLM) Scheduling priority: lower is served first (``--scheduling-policy priority``), within
    +-PRIORITY_LIMIT. Through a router, the priority its admission granted replaces it (README "Overload")."""

    def _max_tokens(self) -> int | None:
        raise NotImplementedError

    def check_supported(self) -> None:
        """Refuse what the engine does not do, with a clear 400: the fields both kinds share, then the kind's own."""
        if not 1 <= self.n <= MAX_CHOICES:
            raise ProtocolError(f"n must be in [1, {MAX_CHOICES}], got {self.n}", param="n")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ProtocolError(f"seed must fit in 64 bits, got {self.seed}", param="seed")
        if self.cache_salt is not None and not self.cache_salt:
            raise ProtocolError("cache_salt must be a non-empty string when given", param="cache_salt")
        self.check_extras(streaming=bool(self.stream))
        self.check_kind()

    def check_kind(self) -> None:
        """The checks of the request kind's own fields (protocol.py), after the shared ones above."""

    def continuation_seed(self, num_generated: int) -> int | None:
        """The seed under which this request, re-started after ``num_generated`` tokens (a migrated stream),
        draws what it would have drawn (sampling_params.continuation_seed); None when it is not seeded."""
        from kvmesh.replica.serving.sampling_params import continuation_seed

        return None if self.seed is None else continuation_seed(self.seed, num_generated)

    def _logprobs(self) -> tuple[int | None, int | None]:
        """(logprobs, prompt_logprobs) of the engine's SamplingParams."""
        return None, None

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():  # digits only: int() also reads "5_0", " 5" and non-ASCII digits
            if not (key.isascii() and key.removeprefix("-").isdigit()):
                raise ProtocolError(f"logit_bias keys must be token ids, got {echo(repr(key))}", param="logit_bias")
            bias[int(key)] = value
        return bias

    def _constraint(self) -> StructuredOutputsParams | None:
        """The output's constraint, its compile charged to the tenant the router named, else to ``user``
        (openai/compile_tenant.py, engine/grammar_pool.py)."""
        constraint = self.structured_outputs_params()
        tenant = None if constraint is None else charged_tenant(self, self.user)
        return constraint if not tenant else replace(constraint, tenant=tenant)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def to_sampling_params(self, prompt_len: int, max_model_len: int, default_max_tokens: int | None = None,
                           like: SamplingParams | None = None) -> SamplingParams:
        """``SamplingParams`` for a prompt of ``prompt_len`` tokens on a ``max_model_len`` context (the HTTP edge:
        the field rules are ``SamplingParams``', the context rule ``context_overflow``; a 400 names the field);
        ``like``: another prompt's of this request, copied with this prompt's max_tokens (its lists read once)."""
        self.check_supported()
        if prompt_len < 1:
            raise ProtocolError("prompt is empty; send at least one token", param="prompt")
        room, max_tokens = max_model_len - prompt_len, self._max_tokens()
        if room < 1:
            raise ProtocolError(f"{context_overflow(prompt_len, max_tokens or 0, max_model_len)} The prompt alone "
                                "fills the context, leaving no room to generate: shorten it.", param="prompt")
        if max_tokens is None:
            max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
        if (overflow := context_overflow(prompt_len, max_tokens, max_model_len)) is not None:
            raise ProtocolError(f"{overflow} Lower max_tokens to at most {room} or shorten the prompt.",
                                param="max_tokens")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        logprobs, prompt_logprobs = self._logprobs()
        try:
            if like is not None:
                return like.child(max_tokens=max_tokens)
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else float(self.temperature),
                top_p=1.0 if self.top_p is None else float(self.top_p),
                top_k=-1 if self.top_k in (None, 0) else int(self.top_k),
                seed=self.seed,
                stop=stop,
                stop_token_ids=list(self.stop_token_ids or []),
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                logit_bias=self._logit_bias(),
                structured_outputs=self._constraint(),
                **self.sampling_extras(),
            )
        except SamplingParamsError as e:
            raise ProtocolError(f"bad sampling parameters: {echo(str(e))}", param=e.param) from None
        except (ValueError, TypeError) as e:
            raise ProtocolError(f"bad sampling parameters: {echo(str(e))}") from None
