"""The runner on CUDA (skipped without a GPU): same greedy story as on CPU; every other backend agrees with torch."""

from __future__ import annotations

import pytest
import torch
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.step.scheduler_output import ScheduledRequest, SchedulerOutput
from kvmesh.replica.worker.model_runner import ModelRunner

from .engine_paths import BLOCK_SIZES, CUDA_BACKENDS, cuda_dtype_or_skip

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


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("backend", [b for b in CUDA_BACKENDS if b != "torch"])
def test_each_backend_matches_the_torch_backend_in_bfloat16(stories_path, backend, block_size):
    cuda_dtype_or_skip(backend, block_size, cuda_graphs=False)  # skips, with the reason, a backend absent here

    def runner(name):
        return ModelRunner(EngineConfig(model=str(stories_path), dtype="bfloat16", device="cuda",
                                        attention_backend=name, block_size=block_size,
                                        gpu_memory_utilization=0.05))

    other = greedy(runner(backend), ONCE_UPON_A_TIME, 12)
    assert other == greedy(runner("torch"), ONCE_UPON_A_TIME, 12)
