"""Every field of the OpenAI request models and the hostile values each is sent (the noisy-neighbour suite's cases).

The fields are read from the models (``ENDPOINTS``: one line per request model and the route that reads it), nested
models included (``messages.content``, ``stream_options.include_usage``), so a field added to a model is a case
at once. Each field gets the values of its type (hostile_values.py: null, 10,000-deep nesting, wrong types, huge
and pathological values of its kind) and those ``SPECIFIC`` lists for it: the attacks its meaning allows
(catastrophic regexes, recursive schemas and grammars, 40,000-word choice lists, combinations with other fields).

A field must be named in ``SPECIFIC`` or in ``TYPE_VALUES_ONLY`` (its type's values say all there is to say; the
fields kvmesh refuses whatever their value, refused_fields.py, are there by construction): a field in neither fails
tests/security/test_hostile_fields.py, naming it, so whoever adds a field decides what a tenant can do with it.
"""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass

from kvmesh.replica.openai.protocol import ChatCompletionRequest, CompletionRequest
from kvmesh.replica.openai.refused_fields import BOTH, CHAT_ONLY, COMPLETION_ONLY, RENDER_ONLY
from kvmesh.replica.openai.responses_api.request import REFUSED as RESPONSES_REFUSED
from kvmesh.replica.openai.responses_api.request import ResponsesRequest
from pydantic import BaseModel

from .field_attacks import SPECIFIC
from .hostile_values import Hostile, by_type


@dataclass(frozen=True)
class Endpoint:
    """A route that reads a request model, and the plain request a hostile value is written into."""

    path: str
    model: type[BaseModel]
    plain: dict


ENDPOINTS = (
    Endpoint("/v1/completions", CompletionRequest, {"prompt": "Once upon a time", "max_tokens": 4}),
    Endpoint("/v1/chat/completions", ChatCompletionRequest,
             {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 4}),
    Endpoint("/v1/responses", ResponsesRequest, {"input": "Tell me a story", "max_output_tokens": 4}),
)
"""The request models under attack (a new model is one line here)."""

_REFUSED = frozenset(BOTH | COMPLETION_ONLY | CHAT_ONLY | RENDER_ONLY | RESPONSES_REFUSED.keys())
TYPE_VALUES_ONLY = _REFUSED | {
    "model", "top_k", "ignore_eos", "stream", "stream_options", "stream_options.include_usage",
    "stream_options.continuous_usage_stats", "user", "cache_salt", "return_token_ids", "include_stop_str_in_output",
    "skip_special_tokens", "return_tokens_as_token_ids", "truncation_side", "add_special_tokens", "echo", "suffix",
    "add_generation_prompt", "continue_final_message", "reasoning_effort", "parallel_tool_calls",
    "guided_decoding_backend", "kv_transfer_params", "kv_transfer_params.do_remote_decode",
    "kv_transfer_params.do_remote_prefill", "kv_transfer_params.remote_block_ids",
    "kv_transfer_params.remote_block_media", "kv_transfer_params.remote_lease_id",
    "kv_transfer_params.remote_engine_id", "kv_transfer_params.num_tokens", "messages.name", "messages.tool_call_id",
    "max_completion_tokens", "prompt_token_ids", "include_reasoning", "messages.reasoning",
    "messages.reasoning_content",
    "instructions", "store", "prompt_cache_key", "safety_identifier",
}
"""Fields whose type's values are all they get (the refused fields answer 400 to any value but their default)."""


@dataclass(frozen=True)
class Case:
    """One hostile request: ``value`` written at ``field`` of ``endpoint``'s plain request."""

    endpoint: Endpoint
    field: str
    value: Hostile

    @property
    def name(self) -> str:
        return f"{self.endpoint.path} {self.field} = {self.value.label}"

    def body(self) -> bytes:
        """The request's bytes (built now: a huge value is megabytes)."""
        body = copy.deepcopy(self.endpoint.plain)
        body.update(self.value.also)
        *parents, last = self.field.split(".")
        at = body
        for part in parents:
            inner = at.setdefault(part, {})
            at = inner[0] if isinstance(inner, list) else inner
        at[last] = _SENTINEL
        return json.dumps(body).replace(json.dumps(_SENTINEL), self.value.text()).encode()


_SENTINEL = "kvmesh-hostile-value"


def fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted name, annotation) of every field of ``model`` and of the models nested in it."""
    for name, info in model.model_fields.items():
        yield prefix + name, info.annotation
        for nested in _nested_models(info.annotation):
            yield from fields(nested, f"{prefix}{name}.")


def _nested_models(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg)


def field_names() -> set[str]:
    """Every field name of every endpoint's model (dotted for nested ones)."""
    return {name for endpoint in ENDPOINTS for name, _ in fields(endpoint.model)}


def values(name: str, annotation: object) -> list[Hostile]:
    """What ``name`` is sent: its type's values, then ``SPECIFIC``'s."""
    return [*by_type(annotation), *SPECIFIC.get(name, ())]


def cases() -> list[Case]:
    """Every hostile request of the suite, grouped by field (a field's cases follow each other)."""
    return [Case(endpoint, name, hostile) for endpoint in ENDPOINTS for name, annotation in fields(endpoint.model)
            for hostile in values(name, annotation)]



def uncovered() -> tuple[list[str], list[str]]:
    """(fields in neither ``SPECIFIC`` nor ``TYPE_VALUES_ONLY``, names there that no model has)."""
    names, listed = field_names(), SPECIFIC.keys() | TYPE_VALUES_ONLY
    return sorted(names - listed), sorted(listed - names)
