"""Sampler: greedy, top-k/top-p masks, seeded reproducibility independent of the batch, min_tokens."""

from __future__ import annotations

import torch
from kvmesh.replica.sample.draws import RandomDraws, seed_key, seeded_uniforms
from kvmesh.replica.sample.sampler import Sampler, apply_top_k_top_p, build_sampling_metadata
from kvmesh.replica.serving.sampling_params import SamplingParams

CPU = torch.device("cpu")
V = 50


def sample(logits, params, num_out=0, seed=0):
    md = build_sampling_metadata(list(params), [num_out] * len(params), V, [2], CPU, draws=RandomDraws(seed))
    return Sampler()(logits, md).tolist()


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(1))
    got = sample(logits, [SamplingParams(temperature=0.0)] * 6)
    assert got == logits.argmax(-1).tolist()


def test_greedy_rows_stay_argmax_in_a_mixed_batch():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0), SamplingParams(top_k=1),
              SamplingParams(temperature=0.7)]
    got = sample(logits, params)
    assert got[0] == int(logits[0].argmax()) and got[2] == int(logits[2].argmax())


def test_top_k_keeps_exactly_the_k_largest_per_row():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(3))
    k = torch.tensor([1, 5, V])
    masked = apply_top_k_top_p(logits, k, None)
    for row, kk in enumerate(k.tolist()):
        kept = torch.isfinite(masked[row]).nonzero().flatten()
        assert set(kept.tolist()) == set(logits[row].topk(kk).indices.tolist())
    # the sort path (top-k with top-p disabled on every row) agrees
    torch.testing.assert_close(apply_top_k_top_p(logits, k, torch.ones(3)), masked)


def test_top_p_keeps_smallest_set_reaching_the_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    masked = apply_top_k_top_p(probs.log(), None, torch.tensor([0.75, 1.0]))
    assert torch.isfinite(masked[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(masked[1]).all()
    # top_p tiny keeps only the most likely token
    masked = apply_top_k_top_p(probs.log(), None, torch.tensor([1e-6, 1e-6]))
    assert torch.isfinite(masked).sum(-1).tolist() == [1, 1]


def test_samples_only_from_allowed_tokens():
    logits = torch.zeros(64, V)
    got = sample(logits, [SamplingParams(top_k=3)] * 64)
    # all ties: topk keeps 3 of them; every draw must be one of the finite ones
    allowed = torch.isfinite(apply_top_k_top_p(logits, torch.full((64,), 3), None))
    assert all(bool(allowed[i, t]) for i, t in enumerate(got))


def test_seeded_request_is_reproducible_regardless_of_batch():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(4))
    seeded = SamplingParams(temperature=1.0, seed=1234)
    alone = [sample(logits, [seeded], num_out=n, seed=0)[0] for n in range(8)]
    others = torch.randn(3, V)
    in_batch = [sample(torch.cat([others, logits]), [SamplingParams(temperature=0.9)] * 3 + [seeded],
                       num_out=n, seed=99)[3] for n in range(8)]
    assert alone == in_batch
    assert len(set(alone)) > 1  # the step index changes the draw


def test_unseeded_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1e9] + [-1e9] * (V - 4)]).repeat(4000, 1)
    got = torch.tensor(sample(logits, [SamplingParams(temperature=1.0)] * 4000))
    freq = torch.bincount(got, minlength=V)[:3].float() / 4000
    torch.testing.assert_close(freq, torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0), atol=0.03, rtol=0)


def test_min_tokens_bans_eos_and_stop_tokens_until_reached():
    logits = torch.full((2, V), -5.0)
    logits[:, 2] = 10.0  # EOS is the argmax
    logits[:, 7] = 9.0
    logits[:, 11] = 8.0
    params = [SamplingParams(temperature=0.0, min_tokens=3, max_tokens=8, stop_token_ids=[7])] * 2
    assert sample(logits, params, num_out=1) == [11, 11]
    assert sample(logits, params, num_out=3) == [2, 2]


def draw_frequencies(logits_row, params, n=3000):
    got = torch.tensor(sample(logits_row.repeat(n, 1), [params] * n))
    return torch.bincount(got, minlength=V).float() / n


def test_top_p_and_top_k_draws_follow_the_renormalized_kept_set():
    logits = torch.full((1, V), -8.0)
    logits[0, :4] = torch.tensor([2.0, 1.5, 1.0, 0.0])
    for params in (SamplingParams(top_p=0.8), SamplingParams(top_k=3), SamplingParams(top_k=3, top_p=0.7)):
        k = torch.tensor([params.top_k if params.top_k > 0 else V])
        kept = apply_top_k_top_p(logits.clone(), k, torch.tensor([params.top_p]))
        expected = torch.softmax(kept[0], 0)
        torch.testing.assert_close(draw_frequencies(logits, params), expected, atol=0.035, rtol=0)


def test_flat_distribution_falls_back_to_the_full_sort():
    import kvmesh.replica.sample.sampler as sampler_mod

    old, sampler_mod.TOP_P_CANDIDATES = sampler_mod.TOP_P_CANDIDATES, (2, 4)  # nucleus wider than the candidates
    try:
        logits = -0.001 * torch.arange(V, dtype=torch.float32).unsqueeze(0)  # flat, and no ties (which tied
        logits[0, :10] += 0.5  # token a nucleus keeps is the sort's choice)
        expected = torch.softmax(apply_top_k_top_p(logits.clone(), None, torch.tensor([0.5]))[0], 0)
        torch.testing.assert_close(draw_frequencies(logits, SamplingParams(top_p=0.5)), expected, atol=0.035, rtol=0)
    finally:
        sampler_mod.TOP_P_CANDIDATES = old


def test_a_seeded_nucleus_row_draws_the_same_token_whatever_shares_its_batch():
    vocab = 1000  # more than TOP_P_CANDIDATES[0]: the nucleus is drawn from a candidate shortlist
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(7)) * 2
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=5)
    neighbours = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]  # force other code paths
    for num_out in range(25):
        alone = build_sampling_metadata([seeded], [num_out], vocab, [2], CPU, draws=RandomDraws(1))
        batch = build_sampling_metadata([*neighbours, seeded], [3, 0, num_out], vocab, [2], CPU, draws=RandomDraws(2))
        a = Sampler()(logits[2:], alone).tolist()[0]
        b = Sampler()(logits, batch).tolist()[2]
        assert a == b, num_out


def test_continuation_seed_draws_what_the_original_would_have_drawn():
    """A migrated stream re-starts with its output in the prompt; its seed is moved on so each later
    token comes from the same random number as in the uninterrupted request."""
    from kvmesh.replica.serving.sampling_params import continuation_seed

    for seed in (0, 7, -3, 2**64 - 1):
        for done in (1, 5, 40):
            moved = continuation_seed(seed, done)
            for n in range(3):
                original = seeded_uniforms(torch.tensor([seed_key(seed, done + n)]))
                continued = seeded_uniforms(torch.tensor([seed_key(moved, n)]))
                assert torch.equal(original, continued)


def test_seeded_uniforms_are_splitmix64_computed_on_the_device_in_wrapping_int64():
    """The device hash equals splitmix64 in exact integer arithmetic, and its draws look uniform."""
    def splitmix64(x: int) -> int:
        m = (1 << 64) - 1
        z = (x + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    keys = [seed_key(seed, n) for seed in (0, 1, 2**63 - 1, 2**64 - 1, 12345) for n in range(40)]
    got = seeded_uniforms(torch.tensor(keys)).tolist()
    assert got == [(splitmix64(k) >> 40) / (1 << 24) for k in keys]
    assert 0.4 < sum(got) / len(got) < 0.6 and min(got) >= 0.0 and max(got) < 1.0


def test_allowed_token_ids_confine_their_rows_and_leave_the_others():
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(7))
    allowed = [3, 17, 41]
    params = [SamplingParams(temperature=0.0, allowed_token_ids=allowed), SamplingParams(temperature=0.0),
              *[SamplingParams(temperature=2.0, allowed_token_ids=allowed)] * 3,
              SamplingParams(temperature=2.0, seed=1)]
    got = sample(logits, params, seed=3)
    assert got[0] == allowed[int(logits[0, allowed].argmax())] and got[1] == int(logits[1].argmax())
    assert all(t in allowed for t in got[2:5])
    assert got[5] == sample(logits[5:], params[5:], seed=3)[0]  # a row without them samples as alone
