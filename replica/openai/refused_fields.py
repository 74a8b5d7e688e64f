"""vLLM request fields kvmesh does not implement: each is a 400 naming it when set to anything but vLLM's default.

vLLM's completion and chat request models carry fields for features kvmesh lacks (beam search, prompt
embeddings, thinking token budgets, ...). A client that sets one on purpose and gets a silent 200 is worse off than
one told no, so every such field is declared here (any JSON value, so the answer is always this 400, never a
type error) and ``refuse_unimplemented`` answers the first one set. Sending vLLM's default (``false``, ``1.0``,
``null``, an empty object) is accepted: clients and SDKs send defaults. tests/data/vllm_request_fields.json
lists every field of vLLM's models with what kvmesh does with it; tests/test_vllm_request_fields.py walks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.serving.errors import ProtocolError
from pydantic import JsonValue, create_model


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one field is refused, and which of its values mean "unset"."""

    why: str
    """What kvmesh lacks, for the error message."""
    unset: tuple[JsonValue, ...] = (None,)
    """Values accepted as leaving it unset (vLLM's default, and null)."""

    def allows(self, value: JsonValue) -> bool:
        return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in self.unset)


_EMPTY = (None, {}, [])
BOTH: dict[str, Refusal] = {
    "use_beam_search": Refusal("beam search is not implemented", (None, False)),
    "length_penalty": Refusal("it scores beam search, which is not implemented", (None, 1.0)),
    "watermarking": Refusal("output watermarking is not implemented", (None, False)),
    "logprob_token_ids": Refusal("logprobs of chosen token ids are not implemented; use logprobs", _EMPTY),
    "bad_words": Refusal("bad_words is not implemented; use logit_bias for single tokens", _EMPTY),
    "ec_transfer_params": Refusal("there is no encoder cache to transfer (text-only models)", _EMPTY),
    "vllm_xargs": Refusal("this server has no extensions that read vllm_xargs", _EMPTY),
    "repetition_detection": Refusal("repetition detection is not implemented; use max_tokens"),
    "thinking_token_budget": Refusal("thinking token budgets are not implemented; use max_tokens", (None, -1)),
    "logits_processors": Refusal("custom logits processors are not loaded by this server", _EMPTY),
    "guided_whitespace_pattern": Refusal("xgrammar takes no whitespace pattern; use structured_outputs' "
                                         "disable_any_whitespace", (None, "")),
}
"""Refused on both endpoints."""
COMPLETION_ONLY: dict[str, Refusal] = {
    "prompt_embeds": Refusal("prompt embeddings are not accepted; send text or token ids"),
}
CHAT_ONLY: dict[str, Refusal] = {
    "best_of": Refusal("best_of is for completions; use n", (None, 1)),
    "return_prompt_text": Refusal("the rendered prompt is not returned; use /v1/chat/completions/render",
                                  (None, False)),
    "media_io_kwargs": Refusal("media inputs are not supported (text-only models)", _EMPTY),
    "mm_processor_kwargs": Refusal("multimodal inputs are not supported (text-only models)", _EMPTY),
    # OpenAI's own fields that vLLM's chat model lacks (vLLM ignores them; kvmesh says no)
    "functions": Refusal("functions is OpenAI's deprecated spelling of tools; send tools", _EMPTY),
    "function_call": Refusal("function_call is OpenAI's deprecated spelling of tool_choice; send tool_choice",
                             (None, "none")),
    "audio": Refusal("audio output is not supported (text-only models)"),
    "modalities": Refusal("only text output is supported", (None, ["text"])),
    "prediction": Refusal("predicted outputs are not implemented"),
    "web_search_options": Refusal("there is no web search"),
    "structural_tag": Refusal("structural tags are not supported; constrain the output with structured_outputs or "
                              "response_format", (None, "")),
}


RENDER_ONLY: dict[str, Refusal] = {
    "return_token_offsets": Refusal("the render routes return no token offsets", (None, False)),
}
"""Fields vLLM reads only on its render routes: refused there, ignored on completions and chat (as vLLM does)."""


def _fields(table: dict[str, Refusal]) -> dict[str, tuple[type, None]]:
    return {name: (JsonValue, None) for name in table}


RefusedCompletionFields = create_model("RefusedCompletionFields", __base__=OpenAIBaseModel,
                                       **_fields(BOTH | COMPLETION_ONLY | RENDER_ONLY))
"""The refused fields a completion request declares (any JSON value; ``refuse_unimplemented`` checks them)."""
RefusedChatFields = create_model("RefusedChatFields", __base__=OpenAIBaseModel,
                                 **_fields(BOTH | CHAT_ONLY | RENDER_ONLY))
"""The same for a chat completion request."""


_CHAT, _COMPLETION = BOTH | CHAT_ONLY, BOTH | COMPLETION_ONLY
_REFUSABLE = frozenset(_CHAT) | frozenset(_COMPLETION)
"""Every field refused on completions or chat."""


def refused(request: OpenAIBaseModel) -> dict[str, Refusal]:
    """The refused fields of ``request``'s endpoint."""
    return _CHAT if isinstance(request, RefusedChatFields) else _COMPLETION


def refuse_unimplemented(request: OpenAIBaseModel, table: dict[str, Refusal] | None = None) -> None:
    """A 400 naming the first refused field (by name) that ``request`` sets to something other than unset (of
    ``table``; its endpoint's by default: ``RENDER_ONLY`` for the render routes)."""
    if table is None:
        if request.model_fields_set.isdisjoint(_REFUSABLE):  # most requests send none of them
            return
        table = refused(request)
    for name in sorted(request.model_fields_set & table.keys()):  # only what the client sent
        refusal = table[name]
        if not refusal.allows(getattr(request, name)):
            raise ProtocolError(f"{name} is not supported by this server ({refusal.why}); leave it unset",
                                param=name)
