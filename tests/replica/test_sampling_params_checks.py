"""``SamplingParams``' checks name the first bad field whatever shape the value has (a bool is not a number, NaN is
in no range)."""

from __future__ import annotations

import math

import pytest
from kvmesh.replica.serving.sampling_params import SamplingParams, SamplingParamsError


@pytest.mark.parametrize("field, value, says", [
    ("presence_penalty", False, "presence_penalty must be in [-2, 2], got False"),
    ("presence_penalty", math.nan, "presence_penalty must be in [-2, 2], got nan"),
    ("frequency_penalty", 2.5, "frequency_penalty must be in [-2, 2], got 2.5"),
    ("frequency_penalty", True, "frequency_penalty must be in [-2, 2], got True"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0.0"),
    ("repetition_penalty", True, "repetition_penalty must be > 0, got True"),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5"),
    ("min_p", False, "min_p must be in [0, 1], got False"),
    ("logprobs", True, "logprobs must be an integer in [0, 20] or None, got True"),
    ("prompt_logprobs", 21, "prompt_logprobs must be an integer in [0, 20] or None, got 21"),
    ("stop_token_ids", [1, -1], "stop_token_ids must be non-negative integers, got [1, -1]"),
    ("stop_token_ids", (2, -3), "stop_token_ids must be non-negative integers, got (2, -3)"),
])
def test_a_bad_value_is_named_with_what_it_must_be(field, value, says):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field and str(e.value) == says


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 0), ("presence_penalty", -2.0), ("frequency_penalty", 1), ("repetition_penalty", 2),
    ("repetition_penalty", 1.3), ("min_p", 1), ("min_p", -0.0), ("logprobs", 0), ("prompt_logprobs", 20),
    ("stop_token_ids", [0, 7]), ("stop_token_ids", ()),
])
def test_a_good_value_of_any_number_type_passes(field, value):
    assert getattr(SamplingParams(**{field: value}), field) == value


def test_the_first_bad_field_is_the_one_named():
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(stop_token_ids=[-1], logprobs=99, presence_penalty=9.0)
    assert e.value.param == "stop_token_ids"
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(logprobs=99, presence_penalty=9.0)
    assert e.value.param == "logprobs"


def test_ids_that_are_not_a_list_are_still_read():
    with pytest.raises(TypeError):
        SamplingParams(stop_token_ids=None)
