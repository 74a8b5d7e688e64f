"""Token lists are checked once (n children share them: test_row_token_lists.py), so what was checked must stay what
the engine samples with: SamplingParams keeps its own read-only copy of logit_bias, allowed_token_ids and
stop_token_ids, and a caller that changes a list after building the params changes nothing the engine reads."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

pytest.importorskip("torch")

from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def llm(stories_path):
    return LLM(str(stories_path), dtype="float32", kv_cache_memory=1 << 22)


GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def test_a_callers_dict_changed_after_the_params_are_built_fails_no_other_request(llm):
    vocab = llm.llm_engine.vocab_size
    bias = {3: 100.0}
    params = SamplingParams(temperature=0.0, max_tokens=4, logit_bias=bias)
    del bias[3]
    bias[vocab + 5] = 1.0  # same size, one key outside the vocabulary
    good, biased = llm.generate([[1, 2, 3], [1, 2, 3]], [GREEDY, params])
    assert good.finish_reason == "length" and good.error is None
    assert biased.finish_reason == "length" and biased.output_token_ids == [3, 3, 3, 3]  # the bias it was built with


def test_a_callers_stop_list_changed_after_the_params_are_built_is_not_what_the_engine_bans(llm):
    ids = [5]
    params = SamplingParams(temperature=0.0, max_tokens=4, min_tokens=3, stop_token_ids=ids)
    ids[0] = -5
    assert params.stop_token_ids == [5]
    assert llm.generate([[1, 2, 3]], [params])[0].error is None


@pytest.mark.parametrize("change", [
    lambda sp: sp.stop_token_ids.__setitem__(0, -5),
    lambda sp: sp.stop_token_ids.append(10**9),
    lambda sp: sp.allowed_token_ids.extend([10**9]),
    lambda sp: sp.allowed_token_ids.sort(),
    lambda sp: sp.logit_bias.__setitem__(10**9, 1.0),
    lambda sp: sp.logit_bias.pop(3),
    lambda sp: sp.logit_bias.update({10**9: 1.0}),
], ids=["stop_setitem", "stop_append", "allowed_extend", "allowed_sort", "bias_setitem", "bias_pop", "bias_update"])
def test_the_checked_lists_are_read_only_and_say_how_to_change_them(change):
    sp = SamplingParams(logit_bias={3: 1.0, 4: 2.0}, allowed_token_ids=[4, 3], stop_token_ids=[7, 8], min_tokens=1)
    with pytest.raises(TypeError, match="read-only.*assign a new"):
        change(sp)
    assert sp.logit_bias == {3: 1.0, 4: 2.0} and sp.allowed_token_ids == [4, 3] and sp.stop_token_ids == [7, 8]


def test_an_assigned_list_is_checked_and_then_read_only():
    sp = SamplingParams(stop_token_ids=[7])
    sp.stop_token_ids = [-5]
    with pytest.raises(ValueError, match="stop_token_ids must be non-negative"):
        sp.validate()
    sp.stop_token_ids = [9, 9, 10]
    sp.validate()
    assert sp.stop_token_ids == [9, 10] and sp.largest_token_id == 10
    with pytest.raises(TypeError, match="read-only"):
        sp.stop_token_ids.append(11)


def test_read_only_lists_still_copy_pickle_compare_and_serialize():
    sp = SamplingParams(logit_bias={3: 1.0}, allowed_token_ids=[4, 3], stop_token_ids=[7])
    for other in (pickle.loads(pickle.dumps(sp)), copy.deepcopy(sp), copy.copy(sp), sp.child(seed=2)):
        assert other.logit_bias == {3: 1.0} and other.allowed_token_ids == [4, 3] and other.stop_token_ids == [7]
        other.validate()
    child = sp.child(seed=2)
    assert child.logit_bias is sp.logit_bias and child.allowed_token_ids is sp.allowed_token_ids  # shared, not copied
    fields = sp.as_dict()
    assert type(fields["logit_bias"]) is dict and type(fields["stop_token_ids"]) is list
    assert json.loads(json.dumps(fields))["allowed_token_ids"] == [4, 3]
    assert SamplingParams(**fields) == sp


def test_what_is_read_of_assigned_lists_is_checked_first():
    """largest_token_id and stop_set read lists assigned since the last check only after checking them: what they
    remember is never taken for checked."""
    sp = SamplingParams(stop_token_ids=[7])
    sp.stop_token_ids = [-5]
    with pytest.raises(ValueError, match="stop_token_ids must be non-negative"):
        sp.stop_set(frozenset({2}))
    with pytest.raises(ValueError, match="stop_token_ids must be non-negative"):
        sp.validate()
    sp.stop_token_ids = [7]
    sp.logit_bias = {-1: 1.0}
    with pytest.raises(ValueError, match="logit_bias keys must be non-negative"):
        assert sp.largest_token_id >= 0
    with pytest.raises(ValueError, match="logit_bias keys must be non-negative"):
        sp.validate()


def test_the_lists_a_tensor_parallel_worker_unpickles_are_read_only():
    sp = SamplingParams(logit_bias={3: 1.0}, stop_token_ids=[7, 8], min_tokens=1)
    sp.stop_set(frozenset({2}))
    other = pickle.loads(pickle.dumps(sp))
    assert other.largest_token_id == 8 and other.stop_set(frozenset({2})) == {2, 7, 8}
    with pytest.raises(TypeError, match="read-only"):
        other.logit_bias[9] = 1.0


def test_what_validation_remembers_does_not_travel_to_the_workers():
    """A request sent in full to the tensor-parallel ranks (pickled once per step) carries its lists once: the stop
    sets the engine made of them are made again where they are read, not shipped; copies (n children) share them."""
    sp = SamplingParams(stop_token_ids=list(range(5000)), min_tokens=1)
    size = len(pickle.dumps(sp))
    stops = sp.stop_set(frozenset({2}))
    assert len(pickle.dumps(sp)) == size
    assert sp.child(seed=1).stop_set(frozenset({2})) is stops
    assert pickle.loads(pickle.dumps(sp)).stop_set(frozenset({2})) == stops
