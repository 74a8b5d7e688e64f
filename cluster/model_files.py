"""Where replicas find the model: a local directory, a Hugging Face id, or the embedded model.

The embedded model's files are made once here (cluster/embedded_model.py) and written on every
alive node by a zero-CPU Ray task pinned to it, at the same path, so a multi-node cluster needs
no shared filesystem. A local directory is made absolute (replicas do not share the driver's
working directory) and must exist at that path on every node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kvmesh.cluster.config import ServeConfig
from kvmesh.cluster.embedded_model import cache_dir, embedded_model_files, materialize


def resolve_model_path(config: ServeConfig, handle: Any, report: Callable[[str], None] = print) -> str:
    """The model path every replica (and the router's tokenizer) loads."""
    if config.model.is_embedded:
        files = embedded_model_files()
        path = materialize(files) if handle.local else _materialize_on_all_nodes(files)
        report(f"model: the embedded tiny Llama with RANDOM weights (its text is noise; pass --model for a "
               f"real one), built at {path}")
        return path
    model = os.path.expanduser(config.model.model)
    if os.path.isdir(model):
        path = os.path.abspath(model)
        report(f"model: {path}" + ("" if handle.local else " (must exist at this path on every node)"))
        return path
    if os.path.exists(model) or model.startswith((".", "/")):
        raise FileNotFoundError(f"--model {config.model.model!r} is not a model directory; give a directory "
                                "with config.json, a Hugging Face id, or leave it out for the embedded model")
    report(f"model: {model} (Hugging Face id; each replica's node downloads it unless cached)")
    return model


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
