"""``POST /tokenize`` and ``POST /detokenize`` bodies (vLLM's), for the router and the replica alike."""

from __future__ import annotations

from kvmesh.replica.openai.chat_message import ChatMessage
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.openai.sampling_fields import Count, Flag
from kvmesh.replica.openai.tool_fields import tool_names
from pydantic import JsonValue


class TokenizeRequest(OpenAIBaseModel):
    """``POST /tokenize``: either ``prompt`` (completion rules) or ``messages`` (chat rules)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: Flag = True
    chat_template: str | None = None
    """A template for ``messages`` instead of the model's (refused unless the server trusts request templates)."""
    add_special_tokens: bool | None = None
    """None: the endpoint's rule (True for a prompt, False for messages, as vLLM)."""
    tools: list[JsonValue] | None = None
    """The chat's tools, rendered into the template as a chat completion renders them (vLLM's)."""

    def template_kwargs(self) -> dict:
        """The template's ``tools`` (checked: a 400 naming the part of a tool that is wrong)."""
        return {"tools": self.tools} if tool_names(self.tools) else {}


class DetokenizeRequest(OpenAIBaseModel):
    """``POST /detokenize`` (vLLM's): token ids back to text."""

    model: str | None = None
    tokens: list[Count]
