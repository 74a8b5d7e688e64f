"""The runner on CUDA (skipped without a GPU): same greedy story as on CPU; flash_attn agrees with torch."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.model_runner import ModelRunner
from kvmesh.replica.sampling_params import SamplingParams
from kvmesh.replica.scheduler_output import ScheduledRequest, SchedulerOutput

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0)
ONCE_UPON_A_TIME = [1, 403, 407, 261, 378]


def greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens; frees the runner's GPU memory afterwards (each runner sizes its cache from what is free)."""
    tokens, computed, blocks = list(prompt), 0, list(range(1, 9))
    for _ in range(n):
        req = ScheduledRequest("a", tokens[computed:], computed, blocks, True, GREEDY)
        computed = len(tokens)
        tokens.append(runner.execute_model(SchedulerOutput([req], len(req.token_ids)))["a"])
    del runner
    torch.cuda.empty_cache()
    return tokens


def test_cuda_float32_torch_backend_matches_cpu(stories_path):
    def runner(device):
        return ModelRunner(EngineConfig(model=str(stories_path), dtype="float32", device=device,
                                        attention_backend="torch", gpu_memory_utilization=0.05))

    gpu = runner("cuda")
    assert gpu.num_kv_blocks > 100
    on_gpu = greedy(gpu, ONCE_UPON_A_TIME, 30)
    del gpu
    assert on_gpu == greedy(runner("cpu"), ONCE_UPON_A_TIME, 30)


@pytest.mark.parametrize("block_size", [16, 256])
def test_flash_attn_runner_matches_torch_backend_in_bfloat16(stories_path, block_size):
    pytest.importorskip("flash_attn")

    def runner(backend):
        return ModelRunner(EngineConfig(model=str(stories_path), dtype="bfloat16", device="cuda",
                                        attention_backend=backend, block_size=block_size,
                                        gpu_memory_utilization=0.05))

    flash = greedy(runner("flash_attn"), ONCE_UPON_A_TIME, 12)
    assert flash == greedy(runner("torch"), ONCE_UPON_A_TIME, 12)
