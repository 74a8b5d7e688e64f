"""``kvmesh router``: the KV-cache-aware router in front of any set of replicas.

    kvmesh router --model PATH --replica http://127.0.0.1:8100,events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558
    \\
                  --replica http://127.0.0.1:8101,events=tcp://127.0.0.1:5559,replay=tcp://127.0.0.1:5560
    kvmesh router --config router.yaml --replica ...     # a file with a router: section, as in serve's

Works in front of kvmesh replicas and of vLLM servers started with KV events on
(``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``). A replica
without ``events=`` is followed at the event endpoints its ``/server_info`` advertises (kvmesh replicas do), else
routed by load only (the log and ``/replicas`` say which). The settings are the ``router:`` section of
``kvmesh serve``'s config (same YAML keys, KVMESH_ROUTER_* variables and flags).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from kvmesh.cluster.cli_help import add_grouped_help
from kvmesh.cluster.config.flags import add_config_arguments
from kvmesh.cluster.config.trees import ROUTER_SCHEMA
from kvmesh.cluster.config.vllm_habits import accept_vllm_flags, print_vllm_notes
from kvmesh.cluster.open_bind import warn_open_bind

COMMON_FLAGS = {
    "the replicas and their model": ["--replica", "--model", "--tokenizer", "--served-model-name"],
    "where it listens, who may call it": ["--host", "--port", "--api-key", "--workers"],
    "routing": ["--policy", "--policy-kwargs"],
    "tools and reasoning": ["--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"],
    "this run": ["--config", "--log-level", "--help"],
}
"""What ``kvmesh router --help`` shows (the rest: --help=all, --help=SECTION)."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("router", help="run the KV-cache-aware router (OpenAI API) in front of replicas",
                              add_help=False, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replica", action="append", default=[], metavar="URL[,events=tcp://H:P,replay=tcp://H:P,name=ID]",
                   help="a replica to route to (repeat; more can be added at runtime with POST /replicas)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_config_arguments(p, ROUTER_SCHEMA)
    accept_vllm_flags(p)
    add_grouped_help(p, COMMON_FLAGS)
    p.set_defaults(func=run)


def run(args) -> int:
    import logging

    from kvmesh.cluster.config.flags import ConfigError, config_from_args
    from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas
    from kvmesh.router.config import ReplicaSpec
    from kvmesh.router.control.router_server import RouterServer

    cap_malloc_arenas()  # before any thread allocates
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        command = config_from_args(args, ROUTER_SCHEMA)
        config = replace(command.router, frontend=command.frontend)
        if config.host == "auto":  # one machine: serve's rule
            config = replace(config, host="127.0.0.1")
        _check_paths(config)
        specs = [ReplicaSpec.parse(text) for text in args.replica]
        if config.workers == 0:
            from kvmesh.router.control.workers import spare_cores

            config = replace(config, workers=spare_cores())
        if config.workers > 1:
            from kvmesh.router.control.workers import router_workers

            server = router_workers(config, specs, config.workers)
        else:
            server = RouterServer(config, specs)
    except (ConfigError, ValueError, TypeError, OSError) as e:
        print(f"kvmesh router: {e}", file=sys.stderr)
        return 2
    print_vllm_notes(args, "router")
    warn_open_bind("router", "the router", config.host, config.port,
                   keyed=config.api_key is not None or config.admission.keys_file is not None,
                   key_flags="--api-key, or --admission-keys-file")
    if config.model is None and config.tokenizer is None:
        logging.warning("no --model/--tokenizer: routing by load only (no prefix cache awareness)")
    logging.info("router on http://%s:%d, %d replicas, policy %s, %d worker(s)", config.host, config.port,
                 len(specs), config.policy, config.workers)
    for spec in specs:
        if not spec.events:
            logging.info("replica %s: no events= given; following the KV event endpoints its /server_info "
                         "advertises once it answers, else routing it by load only", spec.replica_id)
    return server.run() or 0


def _check_paths(config) -> None:
    """A --model/--tokenizer that is a path must be a directory (the tokenizer's); serve's wording."""
    import os

    from kvmesh.cluster.launch.model_files import looks_like_path

    for flag, value in (("--model", config.model), ("--tokenizer", config.tokenizer)):
        if value and looks_like_path(value) and not os.path.isdir(os.path.expanduser(value)):
            raise ValueError(f"{flag} {value!r} is not a directory; give a Hugging Face model directory (with "
                             "tokenizer.json) or a hub id such as Qwen/Qwen2.5-0.5B")
