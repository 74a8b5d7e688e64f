"""Chained block hashing: canonical, incremental, salted, validated."""

import pytest
import xxhash
from kvmesh.kvcache.hashing import (
    RequestBlockHasher,
    block_extra_keys,
    encode_extra_keys,
    external_hash,
    generate_seed,
    hash_block_tokens,
    make_none_hash,
    salt_key,
)

NONE = make_none_hash(b"test-seed")


def chain(tokens, block_size, extra=lambda i: None):
    parent, out = NONE, []
    for i in range(len(tokens) // block_size):
        parent = hash_block_tokens(parent, tokens[i * block_size : (i + 1) * block_size], extra(i))
        out.append(parent)
    return out


def test_hash_is_a_16_byte_digest_and_deterministic():
    h = hash_block_tokens(NONE, [1, 2, 3, 4], None)
    assert isinstance(h, bytes) and len(h) == 16
    assert h == hash_block_tokens(NONE, [1, 2, 3, 4], None)


def test_hasher_matches_one_block_at_a_time_hashing():
    tokens = list(range(100, 137))
    hasher = RequestBlockHasher(4, NONE)
    assert hasher.extend(tokens) == chain(tokens, 4)
    assert len(hasher.block_hashes) == 9


def test_decode_one_token_at_a_time_gives_the_prefill_hashes():
    tokens = [7 * i % 50_000 for i in range(67)]
    incremental = RequestBlockHasher(16, NONE)
    for n in range(1, len(tokens) + 1):
        new = incremental.extend(tokens[:n])
        assert len(new) == (1 if n % 16 == 0 else 0)
    assert incremental.block_hashes == RequestBlockHasher(16, NONE).extend(tokens)


def test_hash_depends_on_parent_tokens_and_extra_keys():
    base = hash_block_tokens(NONE, [1, 2], None)
    assert hash_block_tokens(make_none_hash(b"other"), [1, 2], None) != base
    assert hash_block_tokens(NONE, [2, 1], None) != base
    assert hash_block_tokens(NONE, [1, 2], ("lora",)) != base


def test_encoding_is_unambiguous():
    assert encode_extra_keys(("ab",)) != encode_extra_keys(("a", "b"))
    assert encode_extra_keys((1,)) != encode_extra_keys(("1",))
    assert encode_extra_keys((b"x",)) != encode_extra_keys(("x",))
    # Token 0x00000001 must not be confusable with extra-key bytes.
    assert hash_block_tokens(NONE, [1], None) != hash_block_tokens(NONE, [], (b"\x01\x00\x00\x00",))


def test_external_hash_is_the_low_64_bits_unsigned():
    h = hash_block_tokens(NONE, [5, 6, 7], None)
    value = int.from_bytes(h, "big")
    assert external_hash(h) == value & (2**64 - 1)
    assert 0 <= external_hash(h) < 2**64


def test_digest_is_xxh3_128_of_the_canonical_message():
    expected = xxhash.xxh3_128_digest(NONE + b"\x00\x00\x00\x00" + (3).to_bytes(4, "little"))
    assert hash_block_tokens(NONE, [3], None) == expected


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_out_of_range_token_ids_raise_value_error(bad):
    with pytest.raises(ValueError, match="token id"):
        hash_block_tokens(NONE, [1, bad], None)
    with pytest.raises(ValueError, match="token id"):
        RequestBlockHasher(2, NONE).extend([1, bad])


def test_none_hash_depends_on_the_secret_seed():
    assert make_none_hash(b"a") != make_none_hash(b"b")
    assert make_none_hash("a") == make_none_hash(b"a")
    assert len(generate_seed()) == 32 and generate_seed() != generate_seed()
    with pytest.raises(ValueError):
        make_none_hash(b"")


def test_salt_is_an_extra_key_of_the_first_block_only():
    assert block_extra_keys(0, "tenant", None) == (salt_key("tenant"),)
    assert block_extra_keys(1, "tenant", None) is None
    assert block_extra_keys(0, None, None) is None
    assert block_extra_keys(3, "tenant", "lora-a") == ("lora-a",)
    assert block_extra_keys(0, "tenant", "lora-a") == ("lora-a", salt_key("tenant"))  # vLLM's order


def test_salt_key_does_not_reveal_the_salt():
    assert "tenant-secret" not in salt_key("tenant-secret")
    assert salt_key("a") != salt_key("b")


def test_salted_chains_are_disjoint():
    tokens = list(range(64))
    plain = RequestBlockHasher(16, NONE).extend(tokens)
    salted = RequestBlockHasher(16, NONE, cache_salt="s1").extend(tokens)
    other = RequestBlockHasher(16, NONE, cache_salt="s2").extend(tokens)
    assert not set(plain) & set(salted) and not set(salted) & set(other)
    assert RequestBlockHasher(16, NONE, cache_salt="s1").extend(tokens) == salted


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        RequestBlockHasher(0, NONE)
