"""The compiled hot path (router/_native/fastpath.c) gives exactly the pure-Python results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvmesh.events.schema import BlockRemoved, BlockStored
from kvmesh.router.routing import keys as keys_mod
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import RouterKeyHasher, chain_keys_py, pack_tokens

NATIVE = keys_mod.FASTPATH
needs_native = pytest.mark.skipif(NATIVE is None, reason="run with KVMESH_NO_NATIVE=1: the fallback alone")

token_id = st.integers(0, 2**32 - 1)
extra_key = st.one_of(st.none(), st.lists(st.one_of(st.text(max_size=8), st.binary(max_size=8)), max_size=2))


def test_fastpath_is_built_unless_turned_off():
    if os.environ.get("KVMESH_NO_NATIVE", "") not in ("", "0"):
        assert NATIVE is None
    else:
        assert NATIVE is not None, "kvmesh.router._fastpath was not built; run `pip install -e .` (needs gcc)"


def test_env_var_forces_the_python_fallback():
    code = ("from kvmesh.router.routing import keys; from kvmesh.router.routing.index import PrefixIndex; "
            "print(keys.FASTPATH, PrefixIndex().hasher.native)")
    env = {**os.environ, "KVMESH_NO_NATIVE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "False"]


@needs_native
@settings(max_examples=300, deadline=None)
@given(block_size=st.integers(1, 20), data=st.data(), parent=st.integers(0, 2**64 - 1))
def test_native_chain_equals_python_chain(block_size, data, parent):
    num_blocks = data.draw(st.integers(0, 6))
    tokens = data.draw(st.lists(token_id, min_size=num_blocks * block_size,
                                max_size=num_blocks * block_size + block_size - 1))
    extras = data.draw(st.one_of(st.none(), st.lists(extra_key, min_size=num_blocks, max_size=num_blocks)))
    packed = pack_tokens(tokens[: num_blocks * block_size])
    expected = chain_keys_py(packed, num_blocks, block_size, parent, extras)
    assert keys_mod.chain_keys_native(tokens, num_blocks, block_size, parent, extras) == expected
    assert keys_mod.chain_keys_native(packed, num_blocks, block_size, parent, extras) == expected


@needs_native
@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(token_id, max_size=80), salt=st.one_of(st.none(), st.text(max_size=6)),
       lora=st.one_of(st.none(), st.text(max_size=6)))
def test_request_keys_agree_with_and_without_native(tokens, salt, lora):
    assert (RouterKeyHasher(4, seed=99).keys(tokens, salt, lora)
            == RouterKeyHasher(4, seed=99, native=False).keys(tokens, salt, lora))


@needs_native
@pytest.mark.parametrize("bad", [[-1] * 4, [2**32] * 4, [1.5] * 4, ["7"] * 4])
def test_bad_token_ids_fail_the_same_way_on_both_paths(bad):
    errors = []
    for native in (True, False):
        with pytest.raises((ValueError, TypeError)) as info:
            RouterKeyHasher(4, native=native).keys(bad)
        errors.append(info.type)
    assert errors[0] is errors[1]


@needs_native
def test_native_chain_rejects_too_few_tokens_clearly():
    with pytest.raises(ValueError, match="need 8"):
        keys_mod.chain_keys_native([1, 2, 3], 2, 4, 0)


def _random_index(rng_data, num_replicas: int, native: bool) -> tuple[PrefixIndex, list[list[int]]]:
    """Replicas holding random prefixes of a few prompts (some then partly evicted)."""
    bs = 4
    index = PrefixIndex(hasher=RouterKeyHasher(bs, native=native), predict_ttl_s=0.0)
    prompts = [[p * 1000 + i for i in range(12 * bs)] for p in range(3)]
    for r in range(num_replicas):
        p, depth, evict = rng_data[r % len(rng_data)]
        depth = depth % 13
        if not depth:
            continue
        hashes = [r * 10_000 + p * 100 + i for i in range(depth)]
        index.apply(r, [BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=prompts[p][: depth * bs],
                                    block_size=bs, lora_id=None, medium="GPU", lora_name=None)])
        if evict % 3 == 0:  # evicting a middle block breaks the chain after it
            index.apply(r, [BlockRemoved(block_hashes=[hashes[depth // 2]], medium="GPU")])
    return index, prompts


@needs_native
@settings(max_examples=150, deadline=None)
@given(rng_data=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 9)), min_size=1,
                         max_size=10),
       num_replicas=st.sampled_from([1, 3, 8, 64, 70]), cut=st.integers(0, 48))
def test_native_match_equals_python_match(rng_data, num_replicas, cut):
    native, prompts = _random_index(rng_data, num_replicas, native=True)
    python, _ = _random_index(rng_data, num_replicas, native=False)
    for prompt in prompts:
        keys = native.hasher.keys(prompt[: max(cut, 0) * 4 or len(prompt)])
        assert keys == python.hasher.keys(prompt[: max(cut, 0) * 4 or len(prompt)])
        got = native.match(keys)
        assert got == python.match(keys) == native._match_py(keys)
        assert list(got.items()) == list(native._match_py(keys).items())  # same order, too
