"""Where replicas find the model: a local directory, a Hugging Face id, or the embedded model.

The embedded model's files are made once here (cluster/launch/embedded_model.py) and written on every
alive node by a zero-CPU Ray task pinned to it, at the same path, so a multi-node cluster needs
no shared filesystem. A local directory is made absolute (replicas do not share the driver's
working directory) and must exist at that path on every node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvmesh.cluster.config.trees import ServeConfig
from kvmesh.cluster.launch.embedded_model import cache_dir, embedded_model_files, materialize

if TYPE_CHECKING:
    from kvmesh.cluster.launch.ray_cluster import RayHandle


def resolve_model_path(config: ServeConfig, handle: RayHandle, report: Callable[[str], None] = print) -> str:
    """The model path every replica (and the router's tokenizer) loads."""
    if config.is_embedded_model:
        files = embedded_model_files()
        path = materialize(files) if handle.local else _materialize_on_all_nodes(files)
        report(f"model: the embedded tiny Llama with RANDOM weights (its text is noise; pass --model for a "
               f"real one), built at {path}")
        return path
    path = check_model(config.engine.model)
    if os.path.isdir(path):
        report(f"model: {path}" + ("" if handle.local else " (must exist at this path on every node)"))
    else:
        report(f"model: {path} (Hugging Face id, found in the local cache)")
    return path


def looks_like_path(model: str) -> bool:
    """A local path rather than a hub id (``org/name``): it exists, starts like a path, or has two slashes."""
    return os.path.exists(os.path.expanduser(model)) or model.startswith((".", "/", "~")) or model.count("/") > 1


def check_model(model: str, timeout_s: float = 10.0) -> str:
    """A local model directory (made absolute) or a Hugging Face id that resolves; else ValueError, fast.

    Runs before Ray starts. A hub id must be in the local cache or answer within ``timeout_s``;
    with ``HF_HUB_OFFLINE=1`` only the cache counts. No minutes of retries.
    """
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        if not os.path.isfile(os.path.join(expanded, "config.json")):
            raise ValueError(f"model {model!r} is a directory without config.json; give a Hugging Face model "
                             "directory or a hub id")
        return os.path.abspath(expanded)
    if looks_like_path(model):
        raise ValueError(f"model {model!r} is not a directory; give a Hugging Face model directory (with "
                         "config.json) or a hub id such as Qwen/Qwen2.5-0.5B")
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ValueError(f"model {model!r} is not a local directory and huggingface_hub is not installed "
                         "(the engine extra: pip install '.[engine]')") from None
    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return model
    if _offline():
        raise ValueError(f"model {model!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                         f"download it first (`hf download {model}`) or pass a local directory")
    _probe_hub(model, timeout_s)
    return model


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """The Hugging Face hub answers at all (one request, no retries)."""
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/models?limit=1", method="HEAD"),
                               timeout=timeout_s).close()
    except OSError:  # URLError and HTTPError are OSErrors
        return False
    return True


def _probe_hub(model: str, timeout_s: float) -> None:
    """One HEAD request to the hub (no retries): the id exists and is readable, or ValueError."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{model}/resolve/main/config.json", method="HEAD")
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        urllib.request.urlopen(request, timeout=timeout_s).close()
    except urllib.error.HTTPError as e:
        raise ValueError(f"model {model!r}: the Hugging Face hub answered {e.code} ({e.reason}); check the id, "
                         "or set HF_TOKEN for a gated model") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", e)
        raise ValueError(f"model {model!r} is not in the local Hugging Face cache and {endpoint} cannot be "
                         f"reached ({why}); download it first (`hf download {model}`) or pass a local directory"
                         ) from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _materialize_on_all_nodes(files: dict[str, str]) -> str:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    root = cache_dir()

    @ray.remote(num_cpus=0)
    def write(files: dict[str, str], root: str) -> str:
        from pathlib import Path

        return materialize(files, Path(root))

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    paths = ray.get([write.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                     .remote(files, str(root)) for node in nodes])
    if len(set(paths)) != 1:
        raise RuntimeError(f"the embedded model landed at different paths on different nodes: {sorted(set(paths))}")
    return paths[0]
