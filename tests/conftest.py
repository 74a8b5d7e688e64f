"""Shared fixtures: paths to ../shared test data, the session's one local Ray instance, GPU skips."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _has_cuda_device() -> bool:
    """A CUDA device node exists (checked without importing torch: router tests run without it)."""
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") not in ("", "-1")


# Triton kernels (replica/attention/triton_paged_attention.py, ...) run on CPU tensors only through
# Triton's interpreter, and TRITON_INTERPRET must be set before the first `import triton` in the
# process: this file is the first pytest loads. On a CUDA machine the kernels are compiled instead,
# and their tests run on the GPU (kvmesh.replica.triton_utils.triton_problem says what is possible).
if "TRITON_INTERPRET" not in os.environ and not _has_cuda_device():
    os.environ["TRITON_INTERPRET"] = "1"

REPO_ROOT = Path(__file__).resolve().parent.parent
# CI clones the project with shared/ beside it; a user's clone may not have it.
SHARED_DIR = Path(os.environ.get("KVMESH_SHARED_DIR", REPO_ROOT.parent / "shared"))
STORIES_HF = SHARED_DIR / "models" / "stories260K" / "hf"
MOONCAKE_TRACE = SHARED_DIR / "traces" / "mooncake_synthetic_trace.jsonl"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A chat template for stories260K, which ships none (servers refuse chat without one, as vLLM does)."""

# Logical CPUs for the session's Ray instance: more than the machine's cores is fine,
# actors here are mostly idle; it must fit 2 replicas x TP 2 plus the router.
RAY_NUM_CPUS = 8


@pytest.fixture(scope="session")
def stories_path() -> Path:
    """The real tiny Llama (stories260K) as a Hugging Face directory; skips without ../shared."""
    if not (STORIES_HF / "config.json").exists():
        pytest.skip(f"test model not found at {STORIES_HF} (needs ../shared beside the checkout)")
    return STORIES_HF


@pytest.fixture(scope="session")
def mooncake_trace() -> Path:
    """The Mooncake synthetic trace; skips without ../shared."""
    if not MOONCAKE_TRACE.exists():
        pytest.skip(f"trace not found at {MOONCAKE_TRACE} (needs ../shared beside the checkout)")
    return MOONCAKE_TRACE


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test session (started on first use)."""
    import ray

    for attempt in (1, 2):  # Ray gives its raylet a fixed 30 s to register; a loaded box can miss it once
        if ray.is_initialized():
            break
        try:
            ray.init(
                num_cpus=RAY_NUM_CPUS,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                runtime_env={"env_vars": {"KVMESH_TEST": "1"}},
            )
        except Exception as e:
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
            ray.shutdown()
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch  # only imported when GPU tests were collected

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in gpu_items:
        item.add_marker(skip)
