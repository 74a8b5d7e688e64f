"""Attention backends against a naive reference: paged writes, prefix offsets, mixed batches."""

from __future__ import annotations

import math

import pytest
import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.attention.metadata import CommonAttentionMetadata

BLOCK = 4
HQ, HK, DH = 4, 2, 8


def make_step(specs, device, num_blocks=40, seed=0):
    """specs: [(num_computed, num_new)] -> (q, k, v, cache, common, block tables as lists). Decodes must come first."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.zeros(2, num_blocks, BLOCK, HK, DH)
    cache[:, 1:] = torch.randn(2, num_blocks - 1, BLOCK, HK, DH, generator=gen)  # stale contents
    free = list(range(1, num_blocks))
    tables, slots, qsl, seq_lens = [], [], [0], []
    for computed, new in specs:
        n = computed + new
        table = [free.pop(int(torch.randint(len(free), (1,), generator=gen))) for _ in range(math.ceil(n / BLOCK))]
        tables.append(table)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(computed, n)]
        qsl.append(qsl[-1] + new)
        seq_lens.append(n)
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    t = qsl[-1]
    q, k, v = (torch.randn(t, h, DH, generator=gen) for h in (HQ, HK, HK))
    common = CommonAttentionMetadata(
        num_reqs=len(specs), num_decodes=sum(1 for _, new in specs if new == 1), num_actual_tokens=t,
        max_query_len=max(n for _, n in specs), max_seq_len=max(seq_lens), block_size=BLOCK,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device), block_tables=bt.to(device),
        slot_mapping=torch.tensor(slots, device=device), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)
    return q, k, v, cache, common, tables


def reference(q, k, v, cache, specs, tables, scale):
    """Write, then for each request attend its queries over keys 0..position (one token at a time)."""
    cache = cache.clone()
    out, t = torch.empty_like(q), 0
    flat_k, flat_v = cache[0].view(-1, HK, DH), cache[1].view(-1, HK, DH)
    for (computed, new), table in zip(specs, tables, strict=True):
        for i in range(new):
            pos = computed + i
            slot = table[pos // BLOCK] * BLOCK + pos % BLOCK
            flat_k[slot], flat_v[slot] = k[t + i], v[t + i]
        for i in range(new):
            pos = computed + i
            key_slots = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(pos + 1)]
            keys = flat_k[key_slots].repeat_interleave(HQ // HK, dim=1)  # [L, HQ, DH]
            vals = flat_v[key_slots].repeat_interleave(HQ // HK, dim=1)
            w = torch.einsum("hd,lhd->hl", q[t + i], keys).mul(scale).softmax(-1)
            out[t + i] = torch.einsum("hl,lhd->hd", w, vals)
        t += new
    return out, cache


def in_layout(cache, backend):
    """The logical [2, num_blocks, block_size, Hk, Dh] cache in the backend's layout."""
    shape = backend.kv_cache_shape(cache.shape[1], cache.shape[2], cache.shape[3], cache.shape[4])
    if shape == tuple(cache.shape):
        return cache.clone()
    assert shape == (2, cache.shape[3], cache.shape[1], cache.shape[2], cache.shape[4])  # head-major
    return cache.permute(0, 3, 1, 2, 4).contiguous()


SPECS = [(7, 1), (0, 1), (12, 1), (0, 9), (5, 6), (8, 3)]  # decodes first, then fresh/prefix/chunk prefills


def test_torch_backend_matches_reference_on_a_mixed_batch():
    q, k, v, cache, common, tables = make_step(SPECS, torch.device("cpu"))
    expected, expected_cache = reference(q, k, v, cache, SPECS, tables, DH**-0.5)
    backend = get_attn_backend("torch", torch.device("cpu"), torch.float32)
    layout = in_layout(cache, backend)
    got = backend.forward(q, k, v, layout, backend.build(common), DH**-0.5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layout, in_layout(expected_cache, backend))


def test_torch_backend_decode_only_and_prefill_only_batches():
    for specs in ([(3, 1), (17, 1), (0, 1)], [(0, 5), (4, 4)]):
        q, k, v, cache, common, tables = make_step(specs, torch.device("cpu"), seed=1)
        expected, _ = reference(q, k, v, cache, specs, tables, 0.3)
        backend = get_attn_backend("torch", torch.device("cpu"), torch.float32)
        got = backend.forward(q, k, v, in_layout(cache, backend), backend.build(common), 0.3)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_torch_backend_groups_decode_rows_of_very_different_lengths():
    specs = [(n, 1) for n in (90, 85, 60, 44, 40, 33, 30, 21, 20, 17, 9, 8, 7, 5, 3, 2, 1, 0)]  # longest first
    q, k, v, cache, common, tables = make_step(specs, torch.device("cpu"), num_blocks=200, seed=2)
    expected, _ = reference(q, k, v, cache, specs, tables, 0.5)
    backend = get_attn_backend("torch", torch.device("cpu"), torch.float32)
    md = backend.build(common)
    assert len(md.decode_groups) > 1
    got = backend.forward(q, k, v, in_layout(cache, backend), md, 0.5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_auto_backend_is_torch_on_cpu_and_unknown_names_are_rejected():
    assert get_attn_backend(None, torch.device("cpu"), torch.float32).name == "torch"
    with pytest.raises(ValueError, match="unknown attention backend"):
        get_attn_backend("paged_magic", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="flash-attn"):
        get_attn_backend("flash_attn", torch.device("cpu"), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 256])
def test_flash_attn_backend_matches_torch_backend(block_size):
    pytest.importorskip("flash_attn")
    global BLOCK
    old, BLOCK = BLOCK, block_size
    try:
        dev = torch.device("cuda")
        q, k, v, cache, common, tables = make_step(SPECS, dev, num_blocks=40)
        expected, _ = reference(q, k, v, cache, SPECS, tables, DH**-0.5)
        flash = get_attn_backend("flash_attn", dev, torch.bfloat16)
        bf = [x.to(dev, torch.bfloat16) for x in (q, k, v, in_layout(cache, flash))]
        got = flash.forward(*bf, flash.build(common), DH**-0.5)
        torch.testing.assert_close(got.float().cpu(), expected, atol=2e-2, rtol=2e-2)
    finally:
        BLOCK = old
