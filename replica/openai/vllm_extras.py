"""vLLM's request fields beyond OpenAI's that kvmesh implements (the ones it refuses are in refused_fields.py):
on both endpoints the output text's rules, ``allowed_token_ids``, logprobs' token names, prompt logprobs, special
tokens and truncation of the prompt; on chat the template's variables and ``echo``.

Truncation keeps ``truncate_prompt_tokens`` tokens of the rendered prompt (-1: the model's context) from its end
(``truncation_side`` "left", the default) or its start ("right"), as vLLM's renderer does; the router and the
replica truncate alike (openai/renderer.py), so the router routes and prices the prompt the replica runs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from kvmesh.replica.openai.refused_fields import refuse_unimplemented
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.sampling_params import MAX_LOGPROBS
from pydantic import Field, JsonValue

_Flag = Annotated[bool, Field(strict=True)]


class VLLMExtraFields(OpenAIBaseModel):
    """The fields (a mixin of ``SamplingFields``)."""

    include_stop_str_in_output: _Flag = False
    """Keep the stop string, or the stop token's text, at the end of the output."""
    skip_special_tokens: _Flag = True
    """Leave special tokens (``</s>``, ...) out of the output text."""
    allowed_token_ids: list[Annotated[int, Field(strict=True, ge=0)]] | None = None
    """Sample only among these token ids."""
    return_tokens_as_token_ids: _Flag | None = None
    """Logprobs name their tokens ``"token_id:{id}"`` instead of their text."""
    prompt_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    """Return the logprobs of every prompt token (the first has none) and of this many most likely tokens at each
    position, in vLLM's ``prompt_logprobs`` (per completion choice, per chat answer); not streamable. Such a
    request computes its whole prompt rather than reading the prefix cache, as in vLLM."""
    stream_interval: Annotated[int, Field(strict=True, ge=1)] | None = None
    """Stream this many new tokens a chunk (the first and the last chunk go at once); ignored without streaming."""
    truncate_prompt_tokens: Annotated[int, Field(strict=True, ge=-1)] | None = None
    """Keep at most this many prompt tokens (-1: the model's context); None: the prompt as it is."""
    truncation_side: Literal["left", "right"] | None = None
    """Where truncation cuts: "left" (the default) keeps the prompt's last tokens, "right" its first."""
    presence_penalty: float | None = None
    """Subtracted from the logit of every token the output holds, in [-2, 2] (also OpenAI's)."""
    frequency_penalty: float | None = None
    """Times each token's count in the output, subtracted from its logit, in [-2, 2] (also OpenAI's)."""
    repetition_penalty: float | None = None
    """Logits of prompt and output tokens divided by it where positive, multiplied where not (> 0; 1: none)."""
    min_p: float | None = None
    """Drop tokens less likely than min_p x the most likely one, after temperature (in [0, 1])."""
    add_special_tokens: _Flag | None = None
    """Encode the prompt with the tokenizer's special tokens (BOS); None: the endpoint's rule, as vLLM's defaults
    (a completion's text yes, a rendered chat no: its template has them)."""

    def sampling_extras(self) -> dict[str, object]:
        """What these fields set in the engine's ``SamplingParams``."""
        return {"skip_special_tokens": self.skip_special_tokens, "allowed_token_ids": self.allowed_token_ids,
                "include_stop_str_in_output": self.include_stop_str_in_output,
                "presence_penalty": self.presence_penalty or 0.0, "frequency_penalty": self.frequency_penalty or 0.0,
                "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
                "min_p": self.min_p or 0.0}

    def check_extras(self, streaming: bool) -> None:
        """The rules of vLLM's fields: the ones kvmesh refuses (refused_fields.py), prompt logprobs not streamed
        (``streaming``: the request's ``stream``)."""
        refuse_unimplemented(self)
        if self.prompt_logprobs is not None and streaming:
            raise ProtocolError("prompt_logprobs are not available when streaming; send stream=false",
                                param="prompt_logprobs")

    def truncated(self, ids: list[int], max_model_len: int) -> list[int]:
        """``ids`` cut to ``truncate_prompt_tokens`` (the same list when it fits or truncation is off)."""
        keep = max_model_len if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        if keep is None or len(ids) <= keep:
            return ids
        return ids[:keep] if self.truncation_side == "right" else ids[len(ids) - keep:]


RESERVED_TEMPLATE_NAMES = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools",
                                     "documents", "chat_template", "tokenize"})
"""Template variables the request's other fields set; ``chat_template_kwargs`` may not set them."""


class ChatTemplateArgs(OpenAIBaseModel):
    """vLLM's chat fields that become chat template variables (a mixin of ``ChatCompletionRequest``). A template
    that does not use one renders as without it, as with vLLM."""

    chat_template_kwargs: dict[str, JsonValue] | None = None
    """More template variables (e.g. ``{"enable_thinking": false}``)."""
    documents: list[dict[str, str]] | None = None
    """The template's ``documents`` (retrieval-augmented generation; ``title`` and ``text`` each, by convention)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    """The template's ``reasoning_effort``; it also sets ``enable_thinking`` (false for "none") unless
    ``chat_template_kwargs`` does."""
    continue_final_message: _Flag = False
    """Render the chat so that the model continues its final message (transformers' rule: the text is cut after
    that message's content); needs ``add_generation_prompt: false``."""

    def template_kwargs(self) -> dict[str, JsonValue]:
        """The template variables besides the chat, and ``continue_final_message`` (a 400 naming
        ``chat_template_kwargs`` for a reserved one)."""
        kwargs = dict(self.chat_template_kwargs or {})
        if reserved := sorted(RESERVED_TEMPLATE_NAMES & kwargs.keys()):
            raise ProtocolError(f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own fields "
                                "do", param="chat_template_kwargs")
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ProtocolError("continue_final_message needs add_generation_prompt: false (the answer continues "
                                    "the final message instead of starting a new one)", param="continue_final_message")
            kwargs["continue_final_message"] = True
        if self.documents is not None:
            kwargs["documents"] = self.documents
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
            kwargs.setdefault("enable_thinking", self.reasoning_effort != "none")
        return kwargs


class ChatEcho(OpenAIBaseModel):
    """vLLM's chat ``echo`` (a mixin of ``ChatCompletionRequest``, whose ``messages`` it reads)."""

    echo: _Flag = False
    """Start the answer with the last message's text when that message is of the answer's role: the assistant's,
    or with ``add_generation_prompt: false`` the last message's own (vLLM's rule), e.g. to continue a reply."""

    def echo_text(self) -> str:
        """What the answer starts with ("" unless ``echo`` applies)."""
        if not self.echo or not self.messages:
            return ""
        last = self.messages[-1]
        return last.text() if last.role == "assistant" or not self.add_generation_prompt else ""
