"""The host KV tier on a real stories260K engine: a prompt pushed out of a ~50-block device pool comes
back from host memory with the same greedy text, and the events name both tiers as vLLM does."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from kvmesh.events.schema import BlockRemoved, BlockStored  # noqa: E402
from kvmesh.replica.config import EngineConfig  # noqa: E402
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine  # noqa: E402
from kvmesh.replica.serving.sampling_params import SamplingParams  # noqa: E402


class RecordingPublisher:
    def __init__(self) -> None:
        self.events: list = []

    def publish(self, events) -> None:
        self.events += events

    def close(self) -> None:
        pass


def make_engine(stories_path, offload: str | None, **kw) -> tuple[LLMEngine, RecordingPublisher]:
    kw.setdefault("device", "cpu")
    publisher = RecordingPublisher()
    config = EngineConfig(model=str(stories_path), dtype="float32", kv_cache_memory="1MiB",
                          kv_offload_memory=offload, debug_check_integrity=True, **kw)
    return LLMEngine(config, event_publisher=publisher), publisher


def generate(engine: LLMEngine, request_id: str, prompt: list[int], max_tokens: int = 16):
    engine.add_request(EngineRequest(request_id, prompt,
                                     SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)))
    while True:
        for out in engine.step():
            if out.request_id == request_id and out.finished:
                return out


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]


def test_prompt_pushed_out_of_the_device_comes_back_from_the_host_tier(stories_path):
    pushed_out_and_back(stories_path, "cpu")


@pytest.mark.gpu
def test_on_cuda_a_prompt_pushed_out_comes_back_from_pinned_host_memory(stories_path):
    pushed_out_and_back(stories_path, "cuda")


def pushed_out_and_back(stories_path, device: str) -> None:
    engine, publisher = make_engine(stories_path, "64MiB", device=device)
    assert 40 <= engine.num_kv_blocks <= 70 and engine.kv_cache_manager.offload is not None
    long_prompt = prompts(1, 428, seed=0)[0]
    first = generate(engine, "long", long_prompt)
    for i, other in enumerate(prompts(8, 300, seed=1)):  # each pushes most of the device pool out
        generate(engine, f"other{i}", other)
    device_removed = {h for e in publisher.events if type(e) is BlockRemoved and e.medium == "GPU"
                      for h in e.block_hashes}
    stored = [e for e in publisher.events if type(e) is BlockStored]
    long_hashes = stored[0].block_hashes
    assert set(long_hashes) <= device_removed  # the long prompt's blocks left the device
    again = generate(engine, "long-again", long_prompt)
    print(f"device blocks {engine.num_kv_blocks}, host blocks {engine.kv_cache_manager.offload.host.num_blocks}, "
          f"cached_tokens {again.num_cached_tokens}")
    assert again.num_cached_tokens >= 256
    assert again.output_token_ids == first.output_token_ids
    assert {e.medium for e in stored} == {"GPU", "CPU"}
    host_hashes = {h for e in stored if e.medium == "CPU" for h in e.block_hashes}
    assert set(long_hashes) <= host_hashes  # announced as host-tier blocks, as vLLM's connector does
    assert engine.kv_cache_manager.offload.stats.hit_blocks * 16 >= 256


def test_greedy_tokens_same_with_and_without_the_tier_under_heavy_eviction(stories_path):
    shared = prompts(1, 200, seed=2)[0]
    batch = [shared + p for p in prompts(12, 40, seed=3)] + prompts(6, 250, seed=4)
    random.Random(5).shuffle(batch)
    batch += batch[:6]  # repeats, after the pool has turned over
    outputs = {}
    for offload in (None, "64MiB"):
        engine, _ = make_engine(stories_path, offload, max_num_batched_tokens=256, max_num_seqs=4)
        outputs[offload] = [generate(engine, f"r{i}", p, max_tokens=8).output_token_ids
                            for i, p in enumerate(batch)]
    assert outputs[None] == outputs["64MiB"]
    assert engine.kv_cache_manager.offload.stats.hit_blocks > 0
    transformers = pytest.importorskip("transformers")
    import torch

    hf = transformers.AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    for prompt, got in list(zip(batch, outputs["64MiB"], strict=True))[-6:]:  # the repeats, from the host tier
        ids = torch.tensor([prompt])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
        assert got == want
