"""Every Triton kernel specialization is compiled when the runner starts, not while serving
(replica/worker/kernel_warmup.py).

On CPU the kernels run through Triton's interpreter, which compiles nothing, so the warm-up is driven by
hand on a small engine (stories260K cut to 2 layers: every layer launches the same specializations) and
the check counts specialization keys (kernel_keys.py: Triton's own rule for what it compiles a new kernel
for): after the warm-up, serving launches none it has not seen. Split-KV is
sized for a small GPU (8 SMs) so split and unsplit kernels both occur.
"""

from __future__ import annotations

import random

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.layers.custom_op import force_triton
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.triton_utils import triton_problem
from kvmesh.replica.worker.graphs.cuda_graph import StaticDecode
from kvmesh.replica.worker.kernel_warmup import StepShape, run_step_shapes, step_shapes, warm_up_kernels

from .kernel_keys import LaunchKeys

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(triton_problem(DEVICE) is not None, reason=str(triton_problem(DEVICE)))


def test_the_warm_up_steps_cover_every_split_count_and_tile_of_an_h100(monkeypatch):
    from kvmesh.replica.attention import triton_paged_attention as tpa

    monkeypatch.setattr(tpa, "num_sms", lambda device: 132)
    shapes = step_shapes(256, 2048, queries_per_kv=8, num_kv_heads=4, device=torch.device("cuda", 0))
    decode = [s for s in shapes if s.query_len == 1]
    assert decode == [StepShape(1, 1, 32), StepShape(3, 1, 16), StepShape(5, 1, 8), StepShape(9, 1, 4),
                      StepShape(17, 1, 2), StepShape(33, 1, 1)]  # batch sizes where the split count changes
    # G = 8: runs of 2 tokens fill the 16-row tile, 3 or more the 64-row one; each split 1..32 ways
    assert [s for s in shapes if s.query_len > 1] == [StepShape(1, q, s) for q in (2, 3) for s in (1, 2, 4, 8, 16, 32)]


def test_off_cuda_the_runner_skips_the_warm_up(stories_path):
    engine = LLMEngine(EngineConfig(model=str(stories_path), device="cpu", kv_cache_memory=1 << 20),
                       skip_tokenizer_init=True)
    assert warm_up_kernels(engine.model_runner) == 0


def serve(engine: LLMEngine) -> dict[str, list[int]]:
    """A cached prefix, a chunked prefill next to decodes, and decode batches shrinking from 3 rows to 1."""
    rng = random.Random(0)
    shared = [rng.randrange(3, 512) for _ in range(17)]
    prompts = {"a": shared + [5], "b": shared + [7, 8, 9], "c": [rng.randrange(3, 512) for _ in range(30)]}
    for i, (rid, prompt) in enumerate(prompts.items()):
        engine.add_request(EngineRequest(rid, prompt,
                                         SamplingParams(temperature=0.0, max_tokens=3 + 2 * i, ignore_eos=True)))
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_stats().prefix_cache_hits > 0
    return prompts


def alone(engine: LLMEngine, prompt: list[int]) -> None:
    engine.add_request(EngineRequest("alone", prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)))
    while engine.has_unfinished_requests():
        engine.step()


@needs_triton
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "static-decode-and-prefill"])
def test_after_the_warm_up_serving_launches_no_kernel_specialization_it_has_not_compiled(monkeypatch,
                                                                                          two_layer_stories, graphs):
    """``static-decode-and-prefill``: steps on the CUDA graphs' padded shapes (decode rows, and the cached
    prefix's 3-token suffix padded to a 16-token prefill with its split count fixed for the longest context)."""
    from kvmesh.replica.attention import triton_paged_attention as tpa

    monkeypatch.setattr(tpa, "num_sms", lambda device: 8)  # stories260K's 4 KV heads: 1 or 2 decode rows split
    config = EngineConfig(model=str(two_layer_stories), dtype="float32", device=str(DEVICE), attention_backend="triton",
                          block_size=16, kv_cache_memory=1 << 20, max_num_seqs=4, max_num_batched_tokens=24,
                          hash_seed=b"s")
    with LaunchKeys() as warm:
        engine = LLMEngine(config, skip_tokenizer_init=True)  # on CUDA: warmed up here
        force_triton(engine.model_runner.model, True)  # the fused layers, as on CUDA
        if DEVICE.type == "cpu":
            assert run_step_shapes(engine.model_runner, show_progress=False) == 6  # decode: 2 parts, 1; 2 tiles x 1, 2
    runner = engine.model_runner
    if graphs:
        runner.static_decode = StaticDecode(runner.model, runner.attn_backend, 4,
                                            runner.input_batch.block_tables.table.shape[1], 16, runner.device,
                                            runner.max_model_len)
        staged, run = [], runner.static_decode.prefill.run
        runner.static_decode.prefill.run = lambda size, sampling=None: staged.append(size) or run(size, sampling)
    with LaunchKeys() as served:
        prompts = serve(engine)
        if graphs:  # one request alone: 4 tokens over a's cached block
            alone(engine, prompts["a"] + [40, 41, 42])
    assert not graphs or staged == [32, 16]  # "a": 18 fresh tokens (b and c join decoding rows: eager); the 4
    assert served.launches > 0
    assert served.seen - warm.seen == set()
    splits = {dict(options)["NUM_SPLITS"] for name, _, options in warm.seen if name == "_unified_attention_kernel"}
    assert splits == {1, 2}
