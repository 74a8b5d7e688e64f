"""``speculative_config`` is read in vLLM's JSON form and refused with errors that name the key; the n-gram
proposer proposes what followed the longest recurring suffix."""

from __future__ import annotations

import pytest
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.spec_decode.config import SpeculativeConfig, parse_speculative_config
from kvmesh.replica.spec_decode.ngram_proposer import NgramProposer


def test_vllm_form_is_read():
    got = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                    "prompt_lookup_max": 5})
    assert got == SpeculativeConfig(3, 2, 5, "ngram")
    assert parse_speculative_config(None) is None


@pytest.mark.parametrize(("value", "names"), [
    ({"method": "eagle", "num_speculative_tokens": 3}, "method"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "/draft"}, "'model'"),
    ("ngram", "JSON object"),
])
def test_bad_values_are_refused_naming_the_key(value, names):
    with pytest.raises(ValueError, match=names):
        parse_speculative_config(value)


def test_async_scheduling_on_is_refused_with_it():
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(model="m", speculative_config={"num_speculative_tokens": 2}, async_scheduling=True)


def test_the_longest_recurring_ngram_wins():
    proposer = NgramProposer(SpeculativeConfig(3, 1, 3))
    assert proposer.propose([5, 1, 2, 3, 9, 8, 7, 2, 3], 10) == [9, 8, 7]  # "2 3" recurs: what followed it
    assert proposer.propose([5, 1, 2, 3, 9, 8, 7, 2, 3], 2) == [9, 8]  # capped by room
    assert proposer.propose([1, 2, 3, 4], 10) == []  # nothing recurs
    assert proposer.propose([4, 7, 1, 4, 6, 1, 4], 10) == [6, 1, 4]  # "1 4" beats "4"; its first occurrence
