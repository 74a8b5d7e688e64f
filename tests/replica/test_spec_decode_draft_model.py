"""The draft model method: its config in vLLM's form, a draft of another vocabulary refused naming both, its
own KV cache rolled back and shared (drafts after a rollback or an eviction are those of a fresh cache), and
rejection sampling against the draft's distribution q keeping the target's p."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.executor.factory import local_draft_model  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402
from kvmesh.replica.spec_decode.config import SpeculativeConfig, parse_speculative_config  # noqa: E402
from kvmesh.replica.spec_decode.draft_proposer import DraftModelProposer, DraftRequest, common_prefix  # noqa: E402
from kvmesh.replica.spec_decode.rejection import rejection_targets, verify_uniforms  # noqa: E402

from .draft_models import draft_spec  # noqa: E402
from .test_spec_decode_sampled import chi2_quantile_999  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def test_the_draft_model_form_is_read():
    assert parse_speculative_config({"model": "/d", "num_speculative_tokens": 3}) == \
        SpeculativeConfig(3, method="draft_model", model="/d")
    assert parse_speculative_config({"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}).model == "/d"


@pytest.mark.parametrize(("value", "names"), [
    ({"method": "draft_model", "num_speculative_tokens": 3}, "speculative_config.model"),
    ({"model": "", "num_speculative_tokens": 3}, "speculative_config.model"),
    ({"model": "/d", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, "prompt_lookup_max"),
    ({"model": "/d"}, "num_speculative_tokens"),
    ({"method": "eagle", "model": "/d", "num_speculative_tokens": 3}, "method"),
    ({"model": "/d", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}, "draft_tensor_parallel_size"),
])
def test_bad_draft_model_configs_are_refused_naming_the_key(value, names):
    with pytest.raises(ValueError, match=names):
        parse_speculative_config(value)


def test_a_draft_model_with_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        EngineConfig(model="m", tensor_parallel_size=2, speculative_config={"model": "/d", "num_speculative_tokens": 2})


def engine(path, draft) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=4,
                                  kv_cache_memory=1 << 22, speculative_config=draft_spec(draft)))


def test_a_draft_of_another_vocabulary_size_is_refused_naming_both(stories_path, tmp_path):
    draft = shutil.copytree(stories_path, tmp_path / "wide")
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {"vocab_size": 600}))
    with pytest.raises(ValueError, match=r"vocabulary of 600 tokens .* vocabulary of 512 tokens"):
        engine(stories_path, draft)


def test_a_draft_whose_tokens_mean_other_words_is_refused(stories_path, tmp_path):
    draft = shutil.copytree(stories_path, tmp_path / "swapped")
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two tokens swapped
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="must use the target's tokenizer"):
        engine(stories_path, draft)


def test_a_draft_without_weights_is_refused(stories_path, tmp_path):
    draft = shutil.copytree(stories_path, tmp_path / "empty")
    (draft / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        engine(stories_path, draft)


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 4, 5]) == 4
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4, 5]) == 2
    assert common_prefix([7], [1]) == 0
    assert common_prefix([], [1, 2]) == 0


class Proposer:
    """One request at a time through the batch API."""

    def __init__(self, stories_path, draft, num_kv_blocks: int) -> None:
        config = EngineConfig(model=str(stories_path), dtype="float32", device="cpu", block_size=4,
                              speculative_config=draft_spec(draft, 4))
        spec = parse_speculative_config(config.speculative_config)
        model = local_draft_model(config, spec, 512, 256, num_kv_blocks)
        self.batch = DraftModelProposer(spec, model, config.seed)
        self.states = self.batch.states

    def propose(self, request_id, tokens, max_drafts, sp):
        return self.batch.propose([DraftRequest(request_id, tokens, max_drafts, sp)]).get(request_id, ([], None))


proposer = Proposer


def test_drafts_after_a_rollback_or_an_eviction_are_a_fresh_caches(stories_path, perturbed_draft):
    a, b = [1, 403, 407, 261, 378, 445, 263], [1, 264, 383, 270, 449, 262]
    cached = proposer(stories_path, perturbed_draft, 4)  # 4 blocks of 4: room for one request at a time
    first, _ = cached.propose("a", a, 4, GREEDY)
    a2 = a + first[:2] + [5]  # two drafts accepted, then another token: the rest roll back
    b_drafts, _ = cached.propose("b", b, 4, GREEDY)  # takes a's blocks
    assert "a" not in cached.states
    again, _ = cached.propose("a", a2, 4, GREEDY)
    assert cached.states["a"].token_ids == a2 + again[:3]
    rolled, _ = cached.propose("a", a2 + again[:1] + [7], 4, GREEDY)
    reused, _ = cached.propose("a", b[:3] + a2[3:], 4, GREEDY)  # the id again, other tokens from position 1 on
    for tokens, got in ((b, b_drafts), (a2, again), (a2 + again[:1] + [7], rolled), (b[:3] + a2[3:], reused)):
        assert proposer(stories_path, perturbed_draft, 64).propose("x", tokens, 4, GREEDY)[0] == got


def test_sampled_drafts_come_with_their_q_rows(stories_path, perturbed_draft):
    drafts, q = proposer(stories_path, perturbed_draft, 64).propose(
        "a", [1, 403, 407], 3, SamplingParams(temperature=0.8, top_k=3, max_tokens=8))
    assert len(drafts) == 3 and q.shape == (3, 512)
    assert all(q[i, d] > 0 for i, d in enumerate(drafts))
    assert torch.allclose(q.sum(dim=-1), torch.ones(3)) and int((q[0] > 0).sum()) <= 3


def test_rejection_against_q_emits_the_targets_distribution():
    """First emitted token of a draft drawn from q, accepted with min(1, p/q), else drawn from max(0, p - q):
    its frequencies over 6000 draws match p (chi-square, 0.999)."""
    p = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05])
    q = torch.tensor([0.1, 0.5, 0.1, 0.05, 0.25])
    logits = p.log()[None]
    sp = SamplingParams(temperature=1.0)
    gen, draws = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    n = 6000
    seen = Counter(rejection_targets(logits, [int(torch.multinomial(q, 1, generator=draws))], sp,
                                     verify_uniforms(sp, 0, 1, gen, torch.device("cpu")), q[None])[0]
                   for _ in range(n))
    stat = sum((seen[t] - n * float(p[t])) ** 2 / (n * float(p[t])) for t in range(5))
    assert stat < chi2_quantile_999(4), seen


def test_a_batch_drafts_what_each_request_drafts_alone(stories_path, perturbed_draft):
    a, b, c = [1, 403, 407, 261, 378, 445, 263], [1, 264, 383, 270, 449, 262], [1, 445, 263]
    batch = proposer(stories_path, perturbed_draft, 64)
    batch.propose("b", b, 4, GREEDY)  # b's cache ahead: one decode row and two prefill rows in the next batch
    b2 = b + batch.states["b"].token_ids[len(b):len(b) + 1] + [9]
    got = batch.batch.propose([DraftRequest("a", a, 4, GREEDY), DraftRequest("b", b2, 2, GREEDY),
                               DraftRequest("c", c, 3, GREEDY)])
    for rid, tokens, k in (("a", a, 4), ("b", b2, 2), ("c", c, 3)):
        assert got[rid][0] == proposer(stories_path, perturbed_draft, 64).propose(rid, tokens, k, GREEDY)[0]
        assert len(got[rid][0]) == k


def test_a_batch_never_takes_blocks_from_its_own_requests(stories_path, perturbed_draft):
    """4 blocks of 4: a fits (3 blocks), b does not fit beside it and gets no drafts; a's blocks stay a's."""
    batch = proposer(stories_path, perturbed_draft, 4)
    a, b = [1, 403, 407, 261, 378, 445, 263], [1, 264, 383, 270, 449, 262]
    got = batch.batch.propose([DraftRequest("a", a, 4, GREEDY), DraftRequest("b", b, 4, GREEDY)])
    assert "b" not in got and len(got["a"][0]) == 4
    assert got["a"][0] == proposer(stories_path, perturbed_draft, 64).propose("a", a, 4, GREEDY)[0]


def test_a_draft_forward_runs_on_the_meta_device():
    """Decode and prefill rows of a draft forward, every tensor on meta (test_meta_device_model.py's check: no
    tensor made on the CPU meets the model's device)."""
    from kvmesh.replica.attention.backend import get_attn_backend
    from kvmesh.replica.spec_decode.draft_proposer import DraftRow
    from kvmesh.replica.worker.draft_model import DraftModel

    from .test_meta_device_model import META, SPECS, build_on

    spec = SPECS["LlamaForCausalLM"]
    draft = DraftModel.__new__(DraftModel)
    draft.device, draft.block_size, draft.num_blocks = META, 4, 8
    draft.model, draft.backend = build_on(META, spec), get_attn_backend("torch", META, torch.float32)
    draft.kv_cache = torch.zeros(spec.num_hidden_layers, *draft.backend.kv_cache_shape(8, 4, 2, 8), device=META)
    for i, attn in enumerate(draft.model.attention_layers()):
        attn.backend, attn.kv_cache = draft.backend, draft.kv_cache[i]
    logits = draft.forward([DraftRow([1], 2, [5]), DraftRow([2, 3], 3, [1, 2, 3, 4])])
    assert logits.device == META and tuple(logits.shape) == (2, spec.vocab_size)
