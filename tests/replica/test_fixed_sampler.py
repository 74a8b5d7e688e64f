"""The decode graph's sampler (fixed_sampler.py) against the eager sampler: the same tokens for every path the
graph covers, the right distribution for unseeded rows, fixed ops only (no host fact, nothing read back)."""

from __future__ import annotations

import random

import pytest
import torch
from kvmesh.replica.sample.draws import RandomDraws
from kvmesh.replica.sample.fixed_sampler import LOGPROBS, RANDOM, TOP_K_TOP_P, fixed_settings, sample_fixed
from kvmesh.replica.sample.sampler import Sampler, apply_top_k_top_p, argmax, build_sampling_metadata
from kvmesh.replica.serving.sampling_params import SamplingParams

CPU = torch.device("cpu")
PATHS = {
    "greedy": dict(temperature=0.0),
    "top_k=1": dict(temperature=0.8, top_k=1),
    "seeded": dict(temperature=0.9, seed=11),
    "unseeded": dict(temperature=1.1),
    "top_k": dict(temperature=0.8, top_k=7, seed=3),
    "top_p": dict(temperature=1.0, top_p=0.85, seed=4),
    "top_k_top_p": dict(temperature=1.3, top_k=40, top_p=0.9, seed=5),
    "nucleus_unseeded": dict(temperature=0.7, top_p=0.6),
    "top_k_past_the_vocabulary": dict(temperature=0.9, top_k=100_000, seed=6),
}


def eager_tokens(logits, params, num_generated, seed):
    md = build_sampling_metadata(params, num_generated, logits.shape[-1], [2], CPU, draws=RandomDraws(seed))
    return Sampler()(logits, md).tolist()


def fixed_tokens(logits, params, num_generated, seed):
    variant, settings = fixed_settings(params, num_generated, RandomDraws(seed))
    temperature, top_k, top_p, keys = (torch.from_numpy(a) for a in settings)
    return sample_fixed(logits, argmax(logits), temperature, top_k, top_p, keys, variant).tolist()


@pytest.mark.parametrize("vocab", [50, 512, 5000])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_graphs_sampler_draws_the_eager_samplers_tokens(path, vocab):
    """One path per batch over 40 steps of real-looking logits: identical tokens (vocab 5000 > the eager
    sampler's first nucleus shortlist of 256, so the shortlist and the full sort meet too)."""
    gen = torch.Generator().manual_seed(vocab)
    params = [SamplingParams(**PATHS[path])] * 6
    for step in range(40):
        logits = torch.randn(6, vocab, generator=gen) * 3
        num_generated = [step + i for i in range(6)]
        assert fixed_tokens(logits, params, num_generated, step) == eager_tokens(logits, params, num_generated, step)


@pytest.mark.parametrize("vocab", [64, 1000])
def test_a_mixed_batch_draws_the_eager_tokens_and_each_seeded_row_its_own(vocab):
    """Every path in one batch, in shuffled orders: the graph's and the eager tokens agree, and a seeded row's
    token does not depend on its neighbours (a padded graph row or another request)."""
    gen = torch.Generator().manual_seed(7)
    rng = random.Random(vocab)
    names = sorted(PATHS)
    for step in range(25):
        rng.shuffle(names)
        params = [SamplingParams(**PATHS[name]) for name in names]
        logits = torch.randn(len(names), vocab, generator=gen) * 2
        num_generated = [step] * len(names)
        fixed = fixed_tokens(logits, params, num_generated, step)
        assert fixed == eager_tokens(logits, params, num_generated, step)
        seeded = names.index("top_k_top_p")
        alone = fixed_tokens(logits[seeded:seeded + 1], params[seeded:seeded + 1], [step], 99)
        assert alone == [fixed[seeded]]


def test_the_graphs_sampler_gives_greedy_rows_their_argmax():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5), SamplingParams(top_k=1)] + \
        [SamplingParams(temperature=0.0)] * 2
    got = fixed_tokens(logits, params, [0] * 5, 0)
    assert [got[i] for i in (0, 2, 3, 4)] == [int(logits[i].argmax()) for i in (0, 2, 3, 4)]


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# chi-square critical values at p = 0.001: a right sampler fails one seed in a thousand; these seeds pass
CRITICAL_P001 = {3: 16.27, 5: 20.52}


@pytest.mark.parametrize("params,kept", [
    (SamplingParams(temperature=1.0), 6),
    (SamplingParams(temperature=0.5, top_k=4), 4),
    (SamplingParams(temperature=1.0, top_p=0.8), 4),
])
def test_unseeded_draws_of_the_graphs_sampler_follow_the_distribution(params, kept):
    """6,000 unseeded draws over a 6-token vocabulary (one runner's counter of draws, as across steps): the
    counts fit the temperature-scaled, top-k/top-p renormalized distribution (chi-square, p = 0.001)."""
    logits = torch.tensor([[1.2, 0.4, 0.9, -0.3, 0.0, 0.6]])
    n = 6000
    variant, settings = fixed_settings([params] * n, [0] * n, RandomDraws(2026))
    temperature, top_k, top_p, keys = (torch.from_numpy(a) for a in settings)
    tokens = sample_fixed(logits.repeat(n, 1), argmax(logits.repeat(n, 1)), temperature, top_k, top_p, keys, variant)
    counts = torch.bincount(tokens, minlength=6).double()
    k = torch.tensor([params.top_k if params.top_k > 0 else 6])
    probs = torch.softmax(apply_top_k_top_p(logits / params.temperature, k, torch.tensor([params.top_p]))[0],
                          0).double()
    assert int((counts > 0).sum()) == kept and bool((counts[probs == 0] == 0).all())
    nonzero = probs > 0
    assert chi_square(counts[nonzero], probs[nonzero]) < CRITICAL_P001[kept - 1]


def test_rows_the_graph_cannot_sample_are_left_to_the_eager_sampler():
    draws = RandomDraws(0)
    for params in (SamplingParams(temperature=0.9, logit_bias={5: 2.0}),
                   SamplingParams(temperature=0.9, allowed_token_ids=[5, 6]),
                   SamplingParams(temperature=0.9, min_tokens=3, max_tokens=5)):
        assert fixed_settings([SamplingParams(temperature=0.5), params], [0, 0], draws) is None
    assert draws.count == 0  # no draw was taken for a step the eager sampler will draw
    assert fixed_settings([SamplingParams(temperature=0.9, min_tokens=3, max_tokens=5)], [3], draws) is not None


def test_the_graphs_sampler_makes_its_tensors_on_the_logits_device():
    """On ``meta`` inputs (shapes only) every op runs: a tensor made on the host would meet them and fail, and a
    value read back has none to give."""
    meta = torch.device("meta")
    b, vocab = 4, 128
    f32, i64 = dict(device=meta), dict(device=meta, dtype=torch.int64)
    tokens = sample_fixed(torch.empty(b, vocab, **f32), torch.empty(b, **i64), torch.empty(b, **f32),
                          torch.empty(b, **i64), torch.empty(b, **f32), torch.empty(b, **i64))
    assert tokens.device == meta and tokens.shape == (b,) and tokens.dtype == torch.int64


def test_a_step_without_top_k_or_top_p_rows_takes_the_graph_without_the_sort():
    def variant(*params):
        return fixed_settings(list(params), [0] * len(params), RandomDraws(0))[0]

    hot, cold = SamplingParams(temperature=0.9, seed=1), SamplingParams(temperature=0.0, top_p=0.5, top_k=3)
    assert variant(hot, cold, SamplingParams(temperature=1.2)) == RANDOM  # a greedy row's top-k/top-p draw nothing
    assert variant(hot, SamplingParams(temperature=0.9, top_p=0.95)) == TOP_K_TOP_P
    assert variant(SamplingParams(temperature=0.9, top_k=50), cold) == TOP_K_TOP_P
    assert variant(hot, SamplingParams(temperature=0.0, logprobs=0)) == LOGPROBS
