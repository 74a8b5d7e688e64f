"""The noisy-neighbour suite covers every request field: its cases are read from the request models, and a field
that neither has attacks of its own nor is declared covered by its type's values fails here, named."""

from __future__ import annotations

import json

import pytest
from kvmesh.replica.openai.protocol import CompletionRequest
from pydantic import BaseModel

from . import hostile_fields
from .hostile_fields import Endpoint, cases, field_names, uncovered
from .hostile_values import by_type, kinds


def test_every_request_field_is_in_the_suite():
    missing, stale = uncovered()
    assert not missing, (f"request fields without hostile values: {', '.join(missing)}; list each in "
                         "tests/security/field_attacks.py SPECIFIC with its attacks, or in hostile_fields.py "
                         "TYPE_VALUES_ONLY if its type's values are all a tenant can do with it")
    assert not stale, f"the suite names fields no request model has: {', '.join(stale)}"


class _Grown(CompletionRequest):
    shiny_new_knob: int | None = None


def test_a_field_added_to_a_model_fails_until_the_suite_lists_it(monkeypatch):
    grown = Endpoint("/v1/completions", _Grown, {"prompt": "x"})
    monkeypatch.setattr(hostile_fields, "ENDPOINTS", (*hostile_fields.ENDPOINTS, grown))
    assert uncovered()[0] == ["shiny_new_knob"]
    assert {c.value.label for c in cases() if c.field == "shiny_new_knob"} >= {"null", "NaN", "10**30"}
    monkeypatch.setattr(hostile_fields, "TYPE_VALUES_ONLY", hostile_fields.TYPE_VALUES_ONLY | {"shiny_new_knob"})
    assert uncovered() == ([], [])


def test_nested_models_fields_are_fields_too():
    names = field_names()
    assert {"messages.content", "messages.role", "stream_options.include_usage",
            "kv_transfer_params.remote_url"} <= names


def test_a_type_the_suite_does_not_know_fails_naming_it():
    with pytest.raises(TypeError, match="frozenset"):
        kinds(frozenset[int])
    assert kinds(int | None) == {"int"} and kinds(list[str] | str) == {"list", "str"}


class _Small(BaseModel):
    x: int


def test_every_case_writes_its_value_into_the_plain_request():
    for case in cases():
        if len(raw := case.value.text()) > 1000:
            continue  # the huge ones: their kind is covered by the small ones' check
        body = case.body().decode()
        assert raw in body and "kvmesh-hostile-value" not in body, case.name
    stream = next(c for c in cases() if c.field == "stream_options.include_usage" and c.value.label == "null")
    assert json.loads(stream.body())["stream_options"] == {"include_usage": None}
    content = next(c for c in cases() if c.field == "messages.content" and c.value.label == '""')
    assert json.loads(content.body())["messages"] == [{"role": "user", "content": ""}]
    assert [v.label for v in by_type(_Small)][:3] == ["null", "a list 10,000 deep", "an object 10,000 deep"]
