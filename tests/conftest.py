"""Shared fixtures: paths to ../shared test data, the session's one local Ray instance, the test device.

Device: engines that do not name one run on CUDA when torch sees a GPU, else on the CPU (the engine's
own rule); ``KVMESH_TEST_DEVICE=cpu`` hides the GPUs from the session, ``=cuda`` insists on one. The
``device`` fixture names that device for tests that build tensors themselves. On CUDA, float32 math
is IEEE (no TF32), so CUDA runs compare token for token with transformers and the CPU, and a test
engine that chose neither ``kv_cache_memory`` nor its own ``gpu_memory_utilization`` share takes a
small KV cache (``TEST_KV_CACHE_MEMORY``), not 90% of the card.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from . import cpu_seconds, watchdog
from .file_order import load_seconds, longest_first
from .httpx_tls import share_default_tls_contexts
from .postgres_server import postgres  # noqa: F401 (the fixture: a real PostgreSQL server for the session)
from .signal_guard import (  # noqa: F401 (the fixtures: autouse)
    signal_dispositions_kept,
    signal_handlers_restored,
    started_ignoring,
)
from .tiers import ignore_outside_quick_tier, mark_tiers, tier_guard  # noqa: F401 (tier_guard: an autouse fixture, registered by its import)


def hide_gpus_when_asked() -> None:
    """``KVMESH_TEST_DEVICE=cpu``: hide the GPUs before anything imports torch or triton (the Triton
    switch below then picks the interpreter, and engines that pick a device pick the CPU)."""
    if os.environ.get("KVMESH_TEST_DEVICE", "").strip().lower() == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


hide_gpus_when_asked()
share_default_tls_contexts()  # httpx.get/post in tests: one CA bundle load, not one per call (tests/httpx_tls.py)


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
    "{% for document in documents or [] %}document: {{ document['text'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% if reasoning_effort %} ({{ reasoning_effort }} effort){% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}{% endif %}"
)
"""A chat template for stories260K, which ships none (servers refuse chat without one, as vLLM does)."""

TEST_KV_CACHE_MEMORY = 4 << 20
"""KV cache of a test engine on a real model (bytes): the size on CPU, the cap on CUDA."""
TEST_DEVICES = ("auto", "cpu", "cuda")
"""Values of KVMESH_TEST_DEVICE; auto (the default) is cuda when torch sees a GPU."""

RAY_MISSING = "needs Ray, which is not installed (the engine extra: pip install '.[engine]')"

# Logical CPUs for the session's Ray instance: more than the machine's cores is fine,
# actors here are mostly idle; it must fit 2 replicas x TP 2 plus the router.
RAY_NUM_CPUS = 8
INHERITED_IGNORED = pytest.StashKey[set]()
"""The signals pytest was started with ignored (tests/signal_guard.py)."""


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
    """One local Ray instance for the whole test session (started on first use); skips where Ray is not installed."""
    ray = pytest.importorskip("ray", reason=RAY_MISSING)

    for attempt in (1, 2):  # Ray gives its raylet a fixed 30 s to register; a loaded box can miss it once
        if ray.is_initialized():
            break
        try:
            ray.init(
                address="local",  # the session's own, not one a test (or another session) started with `ray start`
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


def chosen_test_device() -> str:
    choice = os.environ.get("KVMESH_TEST_DEVICE", "auto").strip().lower() or "auto"
    if choice not in TEST_DEVICES:
        raise pytest.UsageError(f"KVMESH_TEST_DEVICE={choice!r}: use one of {', '.join(TEST_DEVICES)} "
                                "(auto = cuda when torch sees a GPU)")
    return choice


def pytest_configure(config):
    config.pluginmanager.register(watchdog, "kvmesh-watchdog")  # a hung test named and failed (tests/watchdog.py)
    cpu_seconds.register(config)  # KVMESH_TEST_CPU_DIR: each test's CPU seconds written (tests/cpu_seconds.py)
    chosen_test_device()  # a typo is a usage error, with the values that work
    hide_gpus_when_asked()
    config.stash[INHERITED_IGNORED] = started_ignoring()  # test processes (xdist's too) start from this one


def pytest_report_header(config):
    if ignored := config.stash.get(INHERITED_IGNORED, set()):
        return f"started with {', '.join(sig.name for sig in sorted(ignored))} ignored: given the default action back"
    return None


def pytest_unconfigure(config):
    """Once the summary is out: a session that imported triton exits without libtriton's leak report.

    libtriton's bindings are nanobind's, and nanobind's own exit handler (run after Python's ``atexit``
    callbacks, from ``Py_AtExit``) prints ~30 lines of "nanobind: leaked N instances / types / functions"
    when an ``ir.context`` is still alive then -- one that an exception's traceback kept (triton 3.9 keeps a
    failed compile's in its JIT cache). Nothing is wrong by then, but it reads like a crash at the end of the
    suite. nanobind's switch (``set_leak_warnings``) is C++ only and triton does not expose it, so do what
    triton does for its own compile workers (``triton/_compile_warmup_pool.py``): point stderr at /dev/null
    from an ``atexit`` callback. Registered last, it runs first: the interpreter's teardown is all that
    follows, the suite's own output is complete."""
    if "triton" in sys.modules:
        atexit.register(_stderr_to_devnull)


def _stderr_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _cuda_available() -> bool:
    """Whether torch sees a GPU; False without importing torch when nothing imported it (torch-free sessions)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available()


def exact_float32(torch) -> None:
    """float32 matmuls and convolutions in IEEE precision on CUDA (TF32 off), as on the CPU. Through the
    calls whose flags torch's legacy readers (``cudnn.allow_tf32``) can still read: setting cuDNN's new
    ``fp32_precision`` flags makes those readers raise on torch >= 2.9."""
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False


def pytest_ignore_collect(collection_path, config):
    return ignore_outside_quick_tier(collection_path, config)  # unimported where the tier would deselect it all


def pytest_collection_modifyitems(config, items):
    mark_tiers(items)  # ray / live, so that `make test-quick` leaves them out (tests/tiers.py)
    items[:] = longest_first(items, load_seconds())  # the test processes end together (tests/file_order.py)
    if importlib.util.find_spec("ray") is None:  # e.g. a GPU box with torch but no Ray: actor and TP tests skip
        for item in items:
            if "ray" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=RAY_MISSING))
    choice = chosen_test_device()
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if choice == "cuda" or gpu_items:
        import torch  # only imported when GPU tests were collected or CUDA was asked for
    if _cuda_available():
        exact_float32(sys.modules["torch"])
        return
    if choice == "cuda":
        raise pytest.UsageError("KVMESH_TEST_DEVICE=cuda but torch sees no CUDA device "
                                f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    skip = pytest.mark.skip(reason="needs CUDA (no GPU on this machine)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """Where a test that runs anywhere builds its engines and tensors: "cuda" when torch sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session", autouse=True)
def small_kv_cache_on_cuda():
    """A test engine on CUDA that chose neither kv_cache_memory nor a gpu_memory_utilization share gets
    TEST_KV_CACHE_MEMORY: at the default 0.9 the session's first engine would take 90% of the card and
    every later engine in the process would find the device full. Session-scoped, so module-scoped
    engine fixtures (set up before any function-scoped fixture) are covered too."""
    if not _cuda_available():
        yield
        return
    from kvmesh.replica.config import EngineConfig
    from kvmesh.replica.worker.model_runner import ModelRunner

    default_share = EngineConfig.__dataclass_fields__["gpu_memory_utilization"].default
    profiled = ModelRunner.profiled_kv_budget

    def capped(self, cap=None):
        if cap is None and self.config.gpu_memory_utilization == default_share:
            cap = TEST_KV_CACHE_MEMORY // self.parallel.tp_size
        return profiled(self, cap)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ModelRunner, "profiled_kv_budget", capped)
        yield


@pytest.fixture(scope="session", autouse=True)
def private_state_directory(tmp_path_factory):
    """Routers the tests start (in this process or as children) keep their stored responses in a state directory of
    this session's, not the user's (replica/openai/responses_api/store_config.py); a test that wants one of its own
    sets ``router.responses.path``."""
    from kvmesh.replica.openai.responses_api.store_config import STATE_DIR_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("kvmesh-state")))
        yield
