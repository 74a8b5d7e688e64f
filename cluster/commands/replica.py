"""``kvmesh replica``: run one replica on its own, without the rest of the cluster.

TP=1 runs in this process without Ray; TP>1 starts a local Ray instance for the worker ranks.
Ports default to DESIGN.md's (HTTP 8100, events 5557, replay 5558); 0 picks free ones, and the
actual addresses are printed as one JSON line on stdout once the replica serves. The engine:
and events: settings are the same as in ``kvmesh serve``'s config (same YAML keys and flags).
``--model embedded`` serves the embedded tiny model with random weights as ``kvmesh serve`` does
(named kvmesh-embedded). ``--num-replicas N`` serves N replicas from this process (one JSON line each, ports
counted up); with ``--emulate PROFILE`` no model runs and each step waits out a GPU timing profile, so a fleet of
16 fits on two cores (docs/emulated-fleet.md).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from kvmesh.cluster.cli_help import add_grouped_help
from kvmesh.cluster.config.flags import add_config_arguments
from kvmesh.cluster.config.trees import REPLICA_SCHEMA, ReplicaCommandConfig
from kvmesh.cluster.config.vllm_forms import add_model_argument
from kvmesh.cluster.config.vllm_habits import accept_vllm_flags, cpu_notes, print_vllm_notes
from kvmesh.cluster.open_bind import warn_open_bind

if TYPE_CHECKING:
    from kvmesh.replica.interfaces import ModelRunnerInterface
    from kvmesh.replica.runtime import ReplicaRuntime


COMMON_FLAGS = {
    "the model": ["MODEL", "--served-model-name", "--tokenizer", "--dtype", "--max-model-len", "--chat-template"],
    "where it listens, who may call it": ["--host", "--port", "--event-port", "--api-key"],
    "the device, memory and batching": ["--device", "--tensor-parallel-size", "--gpu-memory-utilization",
                                        "--kv-cache-memory", "--max-num-seqs"],
    "tools and reasoning": ["--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"],
    "this run": ["--config", "--help"],
}
"""What ``kvmesh replica --help`` shows (the rest: --help=all, --help=SECTION)."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "replica", help="serve one model replica (OpenAI HTTP + KV events) without the cluster", add_help=False,
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(p)
    add_config_arguments(p, REPLICA_SCHEMA)
    accept_vllm_flags(p)
    add_grouped_help(p, COMMON_FLAGS)
    p.set_defaults(func=run)


def load(args: argparse.Namespace) -> ReplicaCommandConfig:
    """The command's config, its model path checked and its ports free; raises ValueError."""
    from kvmesh.cluster.config.flags import config_from_args
    from kvmesh.cluster.launch.model_files import check_model
    from kvmesh.cluster.launch.preflight import check_port_free

    config = embedded(config_from_args(args, REPLICA_SCHEMA))
    server, engine = config.server, config.engine
    if engine.load_format != "dummy" or engine.hf_config is None:
        # clients name the model as it was given (vLLM's rule, and what `kvmesh router --model` with the same
        # value advertises), not as it resolved; the resolved path stays an alias (server/app.py)
        server = replace(server, served_model_name=server.served_model_name or engine.model)
        config = replace(config, server=server, engine=replace(engine, model=check_model(engine.model)))
    for i in range(server.num_replicas):
        nth = server.nth(i)
        check_port_free(nth.host, nth.port, "server.port")
        if nth.event_port is not None and not nth.events_endpoint:
            check_port_free(nth.host, nth.event_port, "server.event_port")
            check_port_free(nth.host, nth.replay_port, "server.replay_port")
    return config


def embedded(config: ReplicaCommandConfig) -> ReplicaCommandConfig:
    """The config with ``--model embedded`` made the embedded model's files, random weights, its KV cache size and
    its served name, as ``kvmesh serve`` gives them to its replicas; any other model as it is."""
    from kvmesh.cluster.config.trees import EMBEDDED_MODEL
    from kvmesh.cluster.launch.embedded_model import (
        SERVED_NAME,
        embedded_model_files,
        materialize,
        served_frontend,
    )
    from kvmesh.cluster.launch.replica_sections import EMBEDDED_KV_CACHE_MEMORY

    engine = config.engine
    if engine.model != EMBEDDED_MODEL:
        return config
    engine = replace(engine, model=materialize(embedded_model_files()), load_format="dummy",
                     kv_cache_memory=engine.kv_cache_memory or EMBEDDED_KV_CACHE_MEMORY)
    server = replace(config.server, served_model_name=config.server.served_model_name or SERVED_NAME)
    return replace(config, engine=engine, server=server, frontend=served_frontend(config.frontend, EMBEDDED_MODEL))


def start(config: ReplicaCommandConfig, model_runner: ModelRunnerInterface | None = None,
          index: int = 0) -> ReplicaRuntime:
    """Replica ``index`` of those this command serves, its sections passed whole (TP > 1: a local Ray instance for
    the ranks)."""
    if config.engine.tensor_parallel_size > 1:
        import ray

        if not ray.is_initialized():
            ray.init(address="local", num_cpus=max(config.engine.tensor_parallel_size + 1, 2),
                     include_dashboard=False, configure_logging=False)  # the ranks' own instance, not another's
    from kvmesh.replica.runtime import ReplicaRuntime

    return ReplicaRuntime.start(config.engine, config.server.nth(index), config.events, config.frontend,
                                replica_id=f"replica-{index}", model_runner=model_runner,
                                kv_transfer=config.kv_transfer)


def start_all(config: ReplicaCommandConfig) -> list[ReplicaRuntime]:
    """Every replica of ``server.num_replicas`` in this process (those started are stopped if one cannot start)."""
    runtimes: list[ReplicaRuntime] = []
    try:
        for i in range(config.server.num_replicas):
            runtimes.append(start(config, index=i))
    except BaseException:
        for runtime in runtimes:
            runtime.shutdown(graceful_s=0)
        raise
    return runtimes


def _device(config: ReplicaCommandConfig) -> str:
    """Where the engine will run: its configured device, else cuda when torch sees one (the engine's rule)."""
    if config.engine.device is not None:
        return config.engine.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> int:
    import logging

    from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas

    cap_malloc_arenas()  # before any thread allocates
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load(args)
    except ValueError as e:
        print(f"kvmesh replica: {e}", file=sys.stderr)
        return 2
    print_vllm_notes(args, "replica")
    for note in cpu_notes(args) if _device(config) == "cpu" else ():
        print(f"kvmesh replica: {note}", file=sys.stderr, flush=True)
    warn_open_bind("replica", "the replica", config.server.host, config.server.port,
                   keyed=config.server.api_key is not None or config.server.router_only)
    try:
        runtimes = start_all(config)
    except (ValueError, OSError) as e:  # a model the engine cannot serve, an address taken meanwhile
        print(f"kvmesh replica: cannot start: {e}", file=sys.stderr)
        return 1
    for runtime in runtimes:
        print(json.dumps(runtime.endpoints()), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        broken = [(r.replica_id, reason) for r in runtimes if (reason := r.broken_reason()) is not None]
        if broken:
            print(f"kvmesh replica: stopping, {broken[0][0]} is broken: {broken[0][1]}", file=sys.stderr)
            for runtime in runtimes:
                runtime.shutdown(graceful_s=0)
            return 1
    for runtime in runtimes:
        runtime.shutdown(graceful_s=10)
    return 0
