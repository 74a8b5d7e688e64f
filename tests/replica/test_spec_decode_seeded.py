"""A seeded sampled request gives the same tokens whatever shares its batch, with speculative decoding as without
(the sampler's rule, sample/draws.py): its acceptance draws, residual draws and a draft model's draws come from keys
of its own seed and output position, never from a generator the batch shares.

Each seed runs alone, then all of them in one batch beside unseeded neighbours; plain decoding is held to the same
check so the test asks of speculation exactly what plain decoding already promises.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .draft_models import draft_spec  # noqa: E402
from .test_spec_decode_sampled import engine, quoting_prompt, run  # noqa: E402

SEEDS = range(6)
NUM_TOKENS = 12


def seeded(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, top_k=3, max_tokens=NUM_TOKENS, ignore_eos=True, seed=seed)


def alone_and_together(path, spec) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Each seeded request on a fresh engine by itself, then all in one batch with three unseeded requests."""
    prompt = quoting_prompt(path)
    alone = {}
    for seed in SEEDS:
        alone.update(run(engine(path, spec), {f"s{seed}": prompt}, {f"s{seed}": seeded(seed)}))
    prompts = {f"s{seed}": prompt for seed in SEEDS} | {f"n{i}": prompt[i:] for i in range(3)}
    params = {f"s{seed}": seeded(seed) for seed in SEEDS} | \
        {f"n{i}": SamplingParams(temperature=1.0, max_tokens=NUM_TOKENS, ignore_eos=True) for i in range(3)}
    together = run(engine(path, spec), prompts, params)
    return alone, {rid: tokens for rid, tokens in together.items() if rid.startswith("s")}


def test_plain_decoding_gives_a_seeded_request_its_tokens_whatever_shares_its_batch(stories_path):
    alone, together = alone_and_together(stories_path, False)
    assert together == alone


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_gives_a_seeded_request_its_tokens_whatever_shares_its_batch(stories_path, method, request):
    spec = True if method == "ngram" else draft_spec(request.getfixturevalue("perturbed_draft"), 3)
    alone, together = alone_and_together(stories_path, spec)
    assert together == alone


def test_speculation_rejects_some_drafts_of_the_seeded_requests(stories_path):
    """The check above reads residual draws: some drafts of these requests are rejected."""
    eng = engine(stories_path, True)
    prompt = quoting_prompt(stories_path)
    run(eng, {f"s{seed}": prompt for seed in SEEDS}, {f"s{seed}": seeded(seed) for seed in SEEDS})
    stats = eng.scheduler.drafter.stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0


@pytest.mark.parametrize("seed", [0, 7, (1 << 63) - 1, -5])
def test_a_continuations_moved_seed_verifies_with_the_same_draws(seed):
    """A stream restarted after 4 tokens (continuation_seed) draws the acceptance and residual uniforms of the
    original at the same positions, for the extreme seeds too; an unseeded request's come from the generator."""
    import torch
    from kvmesh.replica.serving.sampling_params import continuation_seed
    from kvmesh.replica.spec_decode.rejection import verify_uniforms

    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    original = verify_uniforms(seeded(seed), 9, 3, gen, cpu)
    moved = verify_uniforms(seeded(continuation_seed(seed, 4)), 5, 3, gen, cpu)
    assert torch.equal(original, moved)
    assert original.shape == (2, 3) and bool(((original >= 0) & (original < 1)).all())
    assert not torch.equal(original[0], original[1])  # acceptance and residual draws are not the same numbers
    unseeded = SamplingParams(temperature=0.8, max_tokens=4)
    assert not torch.equal(verify_uniforms(unseeded, 9, 3, gen, cpu), verify_uniforms(unseeded, 9, 3, gen, cpu))
