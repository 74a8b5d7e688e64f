"""The Triton paged-attention kernel and backend against a plain-torch reference.

On a machine without CUDA the kernel runs through Triton's interpreter on CPU tensors (tests/conftest.py
sets TRITON_INTERPRET=1 before triton is imported); with CUDA the same tests run the compiled kernel.
Steps are built from ``(num_computed, num_new)`` per request, decodes first, with blocks handed out in
random order and stale random values in every unused slot, so reading a wrong slot shows.
"""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.attention.backend import get_attn_backend
from kvmesh.replica.triton_utils import triton_problem

from . import attention_steps

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(triton_problem(DEVICE) is not None, reason=str(triton_problem(DEVICE)))


def make_step(specs, block_size, hq=4, hk=2, dh=8, dtype=torch.float32, seed=0):
    """specs [(num_computed, num_new)] -> (q, k, v, logical cache [2, num_blocks, bs, Hk, Dh], common)."""
    return attention_steps.make_step(specs, block_size, seed=seed, hq=hq, hk=hk, dh=dh, device=DEVICE, dtype=dtype)


def reference(q, k, v, cache, common, scale):
    """Write k/v at their slots, then each query token attends keys 0..its position (fp32, plain torch)."""
    q, k, v, cache = (x.cpu().float() for x in (q, k, v, cache))
    _, num_blocks, bs, hk, dh = cache.shape
    flat = cache.view(2, -1, hk, dh)
    flat[0, common.slot_mapping.cpu()], flat[1, common.slot_mapping.cpu()] = k, v
    out, qsl, tables = torch.empty_like(q), common.query_start_loc_cpu, common.block_tables.cpu().long()
    for r, seq_len in enumerate(common.seq_lens_cpu):
        start, end = qsl[r], qsl[r + 1]
        pos = torch.arange(seq_len)
        keys_slots = tables[r, pos // bs] * bs + pos % bs
        keys, vals = (flat[i, keys_slots].repeat_interleave(q.shape[1] // hk, dim=1) for i in (0, 1))  # [L, Hq, Dh]
        scores = torch.einsum("qhd,lhd->hql", q[start:end], keys) * scale
        q_pos = seq_len - (end - start) + torch.arange(end - start)
        scores.masked_fill_(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[start:end] = torch.einsum("hql,lhd->qhd", scores.softmax(-1), vals)
    return out, cache


def run_backend(q, k, v, cache, common, scale):
    backend = get_attn_backend("triton", DEVICE, q.dtype)
    layout = cache.clone()  # the triton layout is the logical one
    out = backend.forward(q, k, v, layout, backend.build(common), scale)
    return out, layout


def check(specs, block_size, dtype=torch.float32, **shape):
    q, k, v, cache, common = make_step(specs, block_size, dtype=dtype, **shape)
    scale = q.shape[-1] ** -0.5
    expected, expected_cache = reference(q, k, v, cache, common, scale)
    got, got_cache = run_backend(q, k, v, cache, common, scale)
    if dtype == torch.float32:
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    else:  # bf16/fp16 operands (probabilities rounded for P @ V), fp32 sums: within a rounding of the output
        torch.testing.assert_close(got.cpu(), expected.to(dtype), atol=2e-3, rtol=1.6e-2)
    torch.testing.assert_close(got_cache.cpu().float(), expected_cache)  # every new token at its slot


@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_rows_of_ragged_lengths(block_size):
    # contexts ending mid-block, exactly on a block boundary, and a first token
    check([(70, 1), (block_size - 1, 1), (block_size, 1), (0, 1), (5, 1)], block_size)


@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_over_a_cached_prefix(block_size):
    check([(2 * block_size, 9), (block_size + 3, 20)], block_size)  # prefix of whole blocks, and mid-block


def test_chunked_prefill_chunks_continue_where_the_last_stopped():
    # a long prompt's middle chunk crossing block boundaries next to a fresh prefill and decodes
    check([(33, 1), (0, 1), (0, 17), (24, 40)], 16)


def test_fresh_prefills_only():
    check([(0, 37), (0, 3), (0, 16)], 16)


@pytest.mark.parametrize("hq,hk", [(8, 8), (8, 1), (6, 2)])
def test_grouped_query_heads(hq, hk):
    # MHA, MQA, and 3 query heads per KV head (a tile that is not a power of two)
    check([(20, 1), (7, 1), (16, 12)], 16, hq=hq, hk=hk)


@pytest.mark.parametrize("dh", [64, 24])
def test_head_dims_padded_to_a_power_of_two(dh):
    check([(40, 1), (9, 8)], 16, hq=2, hk=1, dh=dh)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_operands_accumulate_in_fp32(dtype):
    check([(45, 1), (3, 1), (16, 11)], 32, dtype=dtype)


def test_block_size_that_is_not_a_multiple_of_16():
    check([(9, 1), (3, 7)], 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_folded_into_the_cache_write_equals_rotary_then_the_write_bit_for_bit(dtype):
    from kvmesh.replica.attention.triton_reshape_and_cache import reshape_and_cache, rotary_and_cache
    from kvmesh.replica.layers.rotary import RotaryEmbedding

    q, k, v, cache, common = make_step([(37, 1), (0, 9), (20, 6)], 16, hq=6, hk=2, dh=12, dtype=dtype)
    positions = torch.cat([torch.arange(s - n, s) for s, n in zip(common.seq_lens_cpu, [1, 9, 6], strict=True)])
    with torch.device("cpu"):
        rotary = RotaryEmbedding(12, 64, 10000.0).to(DEVICE, dtype)
    rotary.use_triton = True
    q_ref, k_ref, cache_ref = q.clone(), k.clone(), cache.clone().to(DEVICE, dtype)
    rotary(positions.to(DEVICE), q_ref, k_ref)  # in place
    reshape_and_cache(k_ref, v, cache_ref[0], cache_ref[1], common.slot_mapping)
    q_got, k_got, cache_got = q.clone(), k.clone(), cache.clone().to(DEVICE, dtype)
    rotary_and_cache(positions.to(DEVICE), q_got, k_got, v, cache_got[0], cache_got[1], common.slot_mapping,
                     rotary.cos_sin_cache)
    assert torch.equal(q_got, q_ref) and torch.equal(cache_got, cache_ref)
    assert torch.equal(k_got, k)  # k itself is left as it was: only the cache holds it rotated


def test_the_backend_rotates_q_and_k_itself_when_given_the_rotary_table():
    from kvmesh.replica.layers.rotary import RotaryEmbedding

    q, k, v, cache, common = make_step([(37, 1), (3, 7)], 16, hq=4, hk=2, dh=8)
    positions = torch.cat([torch.arange(37, 38), torch.arange(3, 10)]).to(DEVICE)
    with torch.device("cpu"):
        rotary = RotaryEmbedding(8, 64, 10000.0).to(DEVICE)
    rotary.use_triton = False
    backend = get_attn_backend("triton", DEVICE, torch.float32)
    md = backend.build(common)
    q_rot, k_rot = rotary(positions, q, k)
    expected = backend.forward(q_rot, k_rot, v, cache.clone(), md, 0.3)
    got = backend.forward(q.clone(), k.clone(), v, cache.clone(), backend.build(common), 0.3,
                          (positions, rotary.cos_sin_cache))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("sms", [0, 132])  # 0: one part; 132 (an H100): the rows split, merged in the launch
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decode_step_rotates_and_writes_its_new_kv_inside_the_attention_launch(monkeypatch, sms, dtype):
    """Decode-only: the kernel rotates q and the new k and writes k/v itself -- the same output and the same
    cache, bit for bit, as rotary_and_cache then attention (the prefill path)."""
    from kvmesh.replica.attention import triton_paged_attention as tpa
    from kvmesh.replica.attention.triton_reshape_and_cache import rotary_and_cache
    from kvmesh.replica.layers.rotary import RotaryEmbedding

    monkeypatch.setattr(tpa, "num_sms", lambda device: sms)
    specs = [(70, 1), (15, 1), (16, 1), (0, 1), (40, 1)]  # mid-block, block ends, a first token
    q, k, v, cache, common = make_step(specs, 16, hq=6, hk=2, dh=12, dtype=dtype)
    positions = torch.tensor([c for c, _ in specs], device=DEVICE)
    with torch.device("cpu"):
        rotary = RotaryEmbedding(12, 128, 10000.0).to(DEVICE, dtype)
    backend = get_attn_backend("triton", DEVICE, dtype)
    cache = cache.to(DEVICE, dtype)
    q_rot, expected_cache = q.clone(), cache.clone()
    rotary_and_cache(positions, q_rot, k, v, expected_cache[0], expected_cache[1], common.slot_mapping,
                     rotary.cos_sin_cache)
    md = backend.build(common)
    expected = tpa.unified_attention(q_rot, expected_cache[0], expected_cache[1], torch.empty_like(q),
                                     common.query_start_loc, common.seq_lens, common.block_tables, 0.3, 1,
                                     backend.num_splits(md, 3, 2, DEVICE))
    got_cache, q_in, k_in = cache.clone(), q.clone(), k.clone()
    got = backend.forward(q_in, k_in, v, got_cache, md, 0.3, (positions, rotary.cos_sin_cache))
    assert md.num_splits == (1 if sms == 0 else 16)  # 5 rows pad to 8: 16 programs, 16 parts
    assert torch.equal(got_cache, expected_cache) and torch.equal(got, expected)
    assert torch.equal(q_in, q) and torch.equal(k_in, k)  # q and k are read, never written


def test_split_launches_leave_their_arrival_counters_zero_for_the_next_launch_or_replay():
    from kvmesh.replica.attention import triton_paged_attention as tpa

    q, k, v, cache, common = make_step([(100, 1), (31, 1), (0, 1)], 16, hq=4, hk=2)
    _, written = reference(q, k, v, cache, common, 0.3)
    written = written.to(DEVICE, q.dtype)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    outs = [tpa.unified_attention(q, written[0], written[1], torch.empty_like(q), common.query_start_loc,
                                  common.seq_lens, common.block_tables, 0.3, 1, 4, counters=counters)
            for _ in range(2)]
    assert not counters.any()
    assert torch.equal(outs[0], outs[1])


def test_profiling_forward_without_a_cache_is_causal_attention_over_the_step():
    q, k, v, cache, common = make_step([(0, 19), (0, 5)], 16)
    expected, _ = reference(q, k, v, cache, common, 0.5)
    backend = get_attn_backend("triton", DEVICE, torch.float32)
    got = backend.forward(q, k, v, None, backend.build(common), 0.5)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_static_decode_metadata_gives_the_eager_decode_and_finite_padding_rows():
    """The CUDA-graph path: B rows over fixed buffers, rows past the real ones padded as cuda_graph.py pads
    them (token at slot 0 of the null block, seq_len 1)."""
    specs = [(30, 1), (12, 1), (0, 1)]
    q, k, v, cache, common = make_step(specs, 16)
    expected, _ = reference(q, k, v, cache, common, 0.4)
    backend = get_attn_backend("triton", DEVICE, torch.float32)
    b, n = 4, len(specs)
    pad = torch.zeros(b - n, *q.shape[1:], device=DEVICE)
    slot_mapping = torch.cat([common.slot_mapping, torch.zeros(b - n, dtype=torch.int64, device=DEVICE)])
    seq_lens = torch.cat([common.seq_lens, torch.ones(b - n, dtype=torch.int32, device=DEVICE)])
    table = torch.cat([common.block_tables, torch.zeros(b - n, common.block_tables.shape[1], dtype=torch.int32,
                                                        device=DEVICE)])
    md = backend.static_decode_metadata(slot_mapping, seq_lens, table)
    got = backend.forward(torch.cat([q, pad]), torch.cat([k, pad[:, :2]]), torch.cat([v, pad[:, :2]]), cache.clone(),
                          md, 0.4)
    torch.testing.assert_close(got[:n].cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got[n:]).all()


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        get_attn_backend("triton", torch.device("cpu"), torch.float32)


def test_static_decode_buffers_and_metadata_are_born_on_the_runner_device():
    from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode

    meta = torch.device("meta")
    backend = get_attn_backend("triton", DEVICE, torch.bfloat16)
    static = StaticDecode(None, backend, max_num_seqs=8, max_blocks=4, block_size=16, device=meta)
    for md in static.metadata.values():
        assert all(getattr(md, f).device == meta for f in ("slot_mapping", "query_start_loc", "seq_lens",
                                                            "block_table"))


@pytest.mark.parametrize("num_splits", [2, 3])
def test_split_kv_decode_merges_to_the_unsplit_result(num_splits):
    # contexts longer and shorter than the splits (a row of 1 token leaves all but one split empty)
    from kvmesh.replica.attention.triton_paged_attention import unified_attention

    q, k, v, cache, common = make_step([(100, 1), (31, 1), (0, 1)], 16, hq=4, hk=2)
    expected, written = reference(q, k, v, cache, common, 0.3)
    written = written.to(DEVICE, q.dtype)
    out = torch.empty_like(q)
    unified_attention(q, written[0], written[1], out, common.query_start_loc, common.seq_lens, common.block_tables,
                      0.3, 1, num_splits)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [2, 4])
def test_split_kv_of_short_suffixes_over_cached_prefixes_merges_to_the_unsplit_result(num_splits):
    # query blocks of several tokens: each row's causal limit falls in a different part
    from kvmesh.replica.attention.triton_paged_attention import unified_attention

    q, k, v, cache, common = make_step([(300, 5), (40, 17)], 16, hq=8, hk=2)
    expected, written = reference(q, k, v, cache, common, 0.3)
    written = written.to(DEVICE, q.dtype)
    out = torch.empty_like(q)
    unified_attention(q, written[0], written[1], out, common.query_start_loc, common.seq_lens, common.block_tables,
                      0.3, common.max_query_len, num_splits)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_split_kv_is_sized_from_the_sm_count_to_fill_idle_cores(monkeypatch):
    from kvmesh.replica.attention import triton_paged_attention as tpa
    from kvmesh.replica.worker.graphs.cuda_graph import CAPTURE_SIZES

    monkeypatch.setattr(tpa, "_cuda_sms", lambda index: 108)  # an A100
    cuda = torch.device("cuda", 0)
    assert tpa.num_kv_splits(tpa.decode_programs(1, 8), torch.device("cpu")) == 1
    assert tpa.num_kv_splits(tpa.decode_programs(1, 8), cuda) == 16  # 8 programs -> 16 parts
    assert tpa.num_kv_splits(tpa.decode_programs(1, 2), cuda) == tpa.MAX_KV_SPLITS  # as far as allowed
    assert tpa.num_kv_splits(tpa.decode_programs(4, 8), cuda) == 4  # 32 programs -> 4 parts
    assert tpa.num_kv_splits(tpa.decode_programs(16, 8), cuda) == 1  # 128 programs fill the GPU
    # an eager decode step splits like the CUDA graph it would be padded to
    for b in range(1, 200):
        padded = next(size for size in CAPTURE_SIZES if size >= b)
        assert tpa.num_kv_splits(tpa.decode_programs(b, 4), cuda) == \
            tpa.num_kv_splits(tpa.decode_programs(padded, 4), cuda), b
    # other steps: a 16-token suffix (G = 8: 8-token query blocks) over 2k splits; a fresh short prompt hardly
    suffix = tpa.step_programs([0, 16], 8, 16, 4)
    assert suffix == 8 and tpa.num_kv_splits(suffix, cuda, longest_context=2064) == 16
    assert tpa.num_kv_splits(suffix, cuda, longest_context=16) == 1  # under MIN_SPLIT_KEYS: one part
    assert tpa.num_kv_splits(tpa.step_programs([0, 512], 8, 512, 4), cuda, longest_context=512) == 1


def test_the_backend_splits_a_short_suffix_over_a_long_prefix_on_a_gpu(monkeypatch):
    from kvmesh.replica.attention import triton_backend
    from kvmesh.replica.attention import triton_paged_attention as tpa

    monkeypatch.setattr(tpa, "_cuda_sms", lambda index: 132)
    q, k, v, cache, common = make_step([(2048, 16)], 16, hq=32, hk=4)
    md = triton_backend.TritonAttentionBackend().build(common)
    assert triton_backend.TritonAttentionBackend.num_splits(md, 8, 4, torch.device("cuda", 0)) == 16
    q, k, v, cache, common = make_step([(2048, 1)], 16, hq=32, hk=4)
    md = triton_backend.TritonAttentionBackend().build(common)
    assert triton_backend.TritonAttentionBackend.num_splits(md, 8, 4, torch.device("cuda", 0)) == 32


@pytest.mark.gpu
@pytest.mark.parametrize("specs", [[(300, 1), (40, 1)], [(33, 1), (0, 17), (24, 40)]])
def test_cuda_forward_never_syncs_and_launches_its_kernels_once(specs):
    """The cache write and one attention launch, split-KV merged inside it (the plain write: no rotary)."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v, cache, common = make_step(specs, 16, dtype=torch.bfloat16)
    backend = get_attn_backend("triton", DEVICE, torch.bfloat16)
    md = backend.build(common)
    backend.forward(q, k, v, cache.clone(), md, 0.3)  # compile outside the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            backend.forward(q, k, v, cache.clone(), md, 0.3)
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("_reshape_and_cache_kernel" in n for n in names) == 1
    assert sum("_unified_attention_kernel" in n for n in names) == 1
    assert len(names) == 2, names
