"""Greedy tokens equal Hugging Face transformers ``generate`` on the same weights (the external reference)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvmesh.replica.llm import LLM  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402

LILY = ", there was a little girl named Lily. She loved to play"


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def save_random_model(tmp_path_factory, name: str, config) -> tuple[str, object]:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    return str(path), model


@pytest.fixture(scope="module")
def stories(stories_path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    llm = LLM(str(stories_path), dtype="float32", kv_cache_memory=1 << 22, max_num_batched_tokens=64,
              debug_check_integrity=True)
    return llm, hf


def test_stories260k_tells_the_lily_story(stories):
    llm, hf = stories
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert out.output_token_ids == hf_greedy(hf, out.prompt_token_ids, 24)
    assert out.text.startswith(LILY)


def test_stories260k_batch_matches_hf_one_by_one(stories):
    llm, hf = stories
    prompts = ["Once upon a time", "Tom and Sue went to the park. They saw a big dog.", "One day"]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    for out in outs:
        assert out.output_token_ids == hf_greedy(hf, out.prompt_token_ids, 16)


def test_text_and_stop_string_follow_the_tokens(stories):
    llm, hf = stories
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=20, stop=["Lily"]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == "Lily"
    assert out.text == ", there was a little girl named "


RANDOM_MODELS = {
    "llama_gqa": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                      initializer_range=0.2),
    "qwen2_qkv_bias": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                           max_position_embeddings=256, initializer_range=0.2, tie_word_embeddings=False),
}


@pytest.mark.parametrize("name", sorted(RANDOM_MODELS))
def test_random_model_matches_hf(name, tmp_path_factory):
    kw = dict(RANDOM_MODELS[name])
    config = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    path, hf = save_random_model(tmp_path_factory, name, config)
    llm = LLM(path, dtype="float32", kv_cache_memory=1 << 22, block_size=8, max_num_batched_tokens=32)
    prompts = [[5, 17, 42, 9, 100, 3, 77], list(range(10, 50)), [299, 1]]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_token_ids == hf_greedy(hf, prompt, 12), name
