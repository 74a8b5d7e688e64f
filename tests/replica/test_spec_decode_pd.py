"""A request whose prompt's KV was pulled from another replica (the decode side of a P/D split) decodes with
n-gram drafts, or a draft model's (stories260K with noisy weights: the draft's cache is its own, computed on
this side), and gives the holder's plain greedy tokens (real stories260K, ``local`` transport). The prompt
quotes a greedy continuation of its start and then the start again, so n-gram drafts recur."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

from .draft_models import draft_spec  # noqa: E402
from .test_kv_pull_overlap import PROMPT, _agents, _engine, _final  # noqa: E402

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
async def test_a_pulled_prompt_decodes_with_drafts_to_the_holders_tokens(stories_path, method, request):
    spec = SPEC if method == "ngram" else draft_spec(request.getfixturevalue("perturbed_draft"))
    holder, puller = _engine(stories_path), _engine(stories_path, speculative_config=spec)
    holder_agent = agent = None
    try:
        start = PROMPT[:40]
        prompt = start + (await _final(holder, start, GREEDY)).output_token_ids[:40] + start  # 120 tokens
        held = await _final(holder, prompt, GREEDY)
        holder_agent, agent, peer = _agents(holder, puller, 60.0, "spec", "blocking")
        agent.land.set()
        lease = await holder.lease_blocks(prompt, None, 60.0)
        assert await puller.pull_prefix(agent, peer, prompt, lease.remote_block_ids) == 112
        out = await _final(puller, prompt, GREEDY)
        assert out.num_cached_tokens == 112
        assert out.output_token_ids == held.output_token_ids
        assert puller.engine.scheduler.drafter.stats.num_accepted_tokens > 0
        await holder.release_lease(lease.lease_id)
    finally:
        for a in (agent, holder_agent):
            if a is not None:
                a.close()
        puller.shutdown()
        holder.shutdown()
