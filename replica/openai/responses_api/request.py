"""``POST /v1/responses``' body (OpenAI's Responses API) and the chat request it becomes.

Served: ``model``, ``input`` (text or items: items.py), ``instructions``, ``previous_response_id``, ``store``,
``tools`` (function tools), ``tool_choice``, ``parallel_tool_calls``, ``text.format`` (text, json_schema,
json_object: the chat's ``response_format``, so structured outputs constrain it), ``max_output_tokens``,
``temperature``, ``top_p``, ``reasoning.effort`` (the chat template's ``reasoning_effort``), ``stream``,
``metadata`` (returned as sent), ``user``. Accepted and without effect: ``safety_identifier`` (as ``user``),
``prompt_cache_key`` (kvmesh finds a prompt's cache by its prefix), ``stream_options`` (no obfuscation is sent),
``service_tier`` "auto"/"default", ``truncation`` "disabled". Everything in ``REFUSED`` is a 400 naming it when set.
"""

from __future__ import annotations

from typing import Annotated, get_args

from kvmesh.replica.openai.refused_fields import Refusal, refuse_unimplemented
from kvmesh.replica.openai.responses import OpenAIBaseModel
from kvmesh.replica.openai.responses_api.items import chat_messages
from kvmesh.replica.openai.vllm_extras import ChatTemplateArgs
from kvmesh.replica.serving.errors import ProtocolError, echo
from kvmesh.replica.serving.json_types import JSONObject
from pydantic import Field, JsonValue, create_model

Flag = Annotated[bool, Field(strict=True)]
ID_CHARS = 128
"""Longest response id a request may name (kvmesh's are 37 characters)."""
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
"""OpenAI's bounds on ``metadata``."""
ShortText = Annotated[str, Field(max_length=512)]

_EMPTY = (None, {}, [])
REFUSED: dict[str, Refusal] = {
    "background": Refusal("background mode is not served; wait for the answer or stream it", (None, False)),
    "conversation": Refusal("conversation objects are not stored; continue with previous_response_id"),
    "prompt": Refusal("stored prompt templates are not served; send instructions and input"),
    "include": Refusal("there is nothing extra to include (no built-in tools, no encrypted reasoning, no logprobs)",
                       _EMPTY),
    "max_tool_calls": Refusal("built-in tools are not served; function calls are the client's to count"),
    "top_logprobs": Refusal("logprobs are not returned on the Responses API; use /v1/chat/completions",
                            (None, 0)),
    "truncation": Refusal("the input is never truncated: a conversation longer than the context is a 400",
                          (None, "disabled")),
    "service_tier": Refusal("there is one service tier", (None, "auto", "default")),
    "context_management": Refusal("context compaction is not served", _EMPTY),
    "moderation": Refusal("moderation is not served"),
    "prompt_cache_options": Refusal("prompt cache options are not served; kvmesh caches every prompt by its prefix",
                                    _EMPTY),
    "prompt_cache_retention": Refusal("cached prefixes stay while their replica has room; no retention is promised",
                                      (None, "in_memory")),
    "image": Refusal("image generation is not served"),
    "access_programs": Refusal("access programs are not served"),
    "background_options": Refusal("background mode is not served", _EMPTY),
}
"""OpenAI's Responses fields kvmesh does not serve, and the values that leave them unset."""
RefusedResponsesFields = create_model("RefusedResponsesFields", __base__=OpenAIBaseModel,
                                      **{name: (JsonValue, None) for name in REFUSED})
TOOL_CHOICES = ("none", "auto", "required")
EFFORTS: tuple[str, ...] = get_args(get_args(ChatTemplateArgs.model_fields["reasoning_effort"].annotation)[0])
"""The reasoning efforts the chat template's ``reasoning_effort`` takes."""


class ResponsesRequest(RefusedResponsesFields):
    """The body of ``POST /v1/responses`` (module doc)."""

    model: str | None = None
    input: str | list[JsonValue] | None = None
    """Text (one user message) or items (items.py)."""
    instructions: str | None = None
    """A system message before the conversation; not carried to responses that continue this one (OpenAI's rule)."""
    previous_response_id: Annotated[str, Field(max_length=ID_CHARS)] | None = None
    """Continue this stored response's conversation (the caller's tenant's only)."""
    store: Flag = True
    """Keep the response (with its conversation) for ``GET``, ``DELETE`` and ``previous_response_id``."""
    tools: list[JSONObject] | None = None
    """Function tools: ``{"type": "function", "name", "description"?, "parameters"?, "strict"?}``."""
    tool_choice: JsonValue = None
    """"none", "auto", "required" or ``{"type": "function", "name": ...}``."""
    parallel_tool_calls: Flag | None = None
    text: JSONObject | None = None
    """``{"format": {"type": "text"} | {"type": "json_schema", "name", "schema", "strict"?} | {"type":
    "json_object"}}``."""
    max_output_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: JSONObject | None = None
    """``{"effort": ...}``: the chat template's ``reasoning_effort``; a summary is a 400 (none is produced)."""
    stream: Flag = False
    stream_options: JSONObject | None = None
    metadata: dict[str, str] | None = None
    """Up to 16 pairs, returned with the response."""
    user: ShortText | None = None
    safety_identifier: ShortText | None = None
    prompt_cache_key: ShortText | None = None

    def check_supported(self) -> None:
        """The fields as a 400 naming the first that is wrong or not served."""
        refuse_unimplemented(self, REFUSED)
        if self.input is None and self.previous_response_id is None:
            raise ProtocolError("input is missing: send text or a list of input items", param="input")
        if self.metadata is not None:
            if len(self.metadata) > MAX_METADATA_KEYS:
                raise ProtocolError(f"metadata has {len(self.metadata)} keys; send at most {MAX_METADATA_KEYS}",
                                    param="metadata")
            for key, value in self.metadata.items():
                if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
                    raise ProtocolError(f"metadata key {echo(key, 64)}: keys have at most {MAX_METADATA_KEY_CHARS} "
                                        f"characters, values {MAX_METADATA_VALUE_CHARS}", param="metadata")
        if (self.text or {}).get("verbosity") not in (None, "medium"):
            raise ProtocolError("text.verbosity is not served (the model writes as it writes); leave it unset",
                                param="text.verbosity")
        if (self.reasoning or {}).get("effort") not in (None, *EFFORTS):
            raise ProtocolError(f"reasoning.effort must be one of {', '.join(EFFORTS)}, got "
                                f"{echo(repr(self.reasoning['effort']))}", param="reasoning.effort")
        if self.reasoning and self.reasoning.get("summary", self.reasoning.get("generate_summary")) is not None:
            raise ProtocolError("reasoning summaries are not produced; leave reasoning.summary unset",
                                param="reasoning.summary")

    def input_messages(self) -> list[JSONObject]:
        """This request's input as chat messages (items.py)."""
        return [] if self.input is None else chat_messages(self.input)

    def chat_body(self, history: list[JSONObject]) -> JSONObject:
        """The chat completion request that answers this one: ``instructions``, the stored ``history``, the input."""
        messages: list[JsonValue] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += [*history, *self.input_messages()]
        if not messages:
            raise ProtocolError("the conversation is empty: send input", param="input")
        body: JSONObject = {"messages": messages, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        fields = {"model": self.model, "max_completion_tokens": self.max_output_tokens, "temperature": self.temperature,
                  "top_p": self.top_p, "user": self.user, "parallel_tool_calls": self.parallel_tool_calls,
                  "reasoning_effort": (self.reasoning or {}).get("effort")}
        body.update({key: value for key, value in fields.items() if value is not None})
        if self.tools:
            body["tools"] = [chat_tool(tool, i) for i, tool in enumerate(self.tools)]
        if self.tool_choice is not None:
            body["tool_choice"] = chat_tool_choice(self.tool_choice)
        fmt = response_format(self.text)
        if fmt is not None and not (self.tools and self.forces_a_call()):  # a forced call has no text to shape
            body["response_format"] = fmt
        return body

    def forces_a_call(self) -> bool:
        """``tool_choice`` "required" or a named function: the answer is a call, never text (so ``text.format``,
        which shapes text, has nothing to shape; OpenAI's rule)."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)


def chat_tool(tool: JSONObject, i: int) -> JSONObject:
    """A function tool in the chat's shape; any other tool type is a 400 (built-in tools are not served)."""
    if tool.get("type") != "function":
        raise ProtocolError(f"tools.{i} of type {echo(repr(tool.get('type')))} is not served; send function tools "
                            "({\"type\": \"function\", \"name\", \"parameters\"})", param=f"tools.{i}.type")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: JsonValue) -> JsonValue:
    """``tool_choice`` in the chat's shape: a named function moves under ``function``."""
    if choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ProtocolError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or {{\"type\": \"function\", \"name\": "
                        f"...}}, got {echo(repr(choice))}", param="tool_choice")


def response_format(text: JSONObject | None) -> JSONObject | None:
    """``text.format`` as the chat's ``response_format`` (None: free text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ProtocolError("text.format of type json_schema needs its schema as an object",
                                param="text.format.schema")
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": {"name": "response", **schema}}
    raise ProtocolError(f"text.format.type must be text, json_schema or json_object, got {echo(repr(kind))}",
                        param="text.format.type")
