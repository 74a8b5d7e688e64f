"""``kvmesh serve``: start (or join) Ray, the replicas and the router; Ctrl-C stops it all.

With no flags: an embedded local Ray instance on CPU, 2 replicas of a tiny random-weight Llama,
the router on 127.0.0.1:8000, replica i on HTTP 8100+i and KV events 5557+2i (replay +1).
A YAML file (--config), KVMESH_<SECTION>_<FIELD> variables and the flags below change that
(flags win). Secrets: KVMESH_API_KEY, KVMESH_HASH_SEED (the hash seed is refused on the command line).

examples:
  kvmesh serve --model /models/Qwen2.5-0.5B-Instruct --num-replicas 4 --device cuda
  kvmesh serve --policy cache_aware --policy-kwargs session_slack_s=0.5 --policy-kwargs temperature=0.1
  kvmesh serve --config deploy/serve.example.yaml --port 9000 --event-port 0
  kvmesh serve --print-config > my-serve.yaml     # every setting with its doc line
  kvmesh serve --num-replicas 2 --num-prefill-replicas 1   # 2 decode + 1 prefill replica (KV handed over)
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import urllib.parse
from typing import TYPE_CHECKING

from kvmesh.cluster.cli_help import add_grouped_help
from kvmesh.cluster.config.flags import add_config_arguments
from kvmesh.cluster.config.trees import SERVE_SCHEMA, ServeConfig
from kvmesh.cluster.config.vllm_forms import add_model_argument
from kvmesh.cluster.config.vllm_habits import accept_vllm_flags, cpu_notes, print_vllm_notes
from kvmesh.cluster.interrupts import Interrupts, Terminated
from kvmesh.cluster.open_bind import warn_open_bind

if TYPE_CHECKING:
    from kvmesh.cluster.launch.launcher import ServeCluster

EXAMPLE_HEADER = """\
# kvmesh serve config: every setting with its default (`kvmesh serve --print-config` writes this).
# Use: kvmesh serve --config FILE. Precedence: defaults < this file < KVMESH_<SECTION>_<FIELD> < flags.
# Secrets: KVMESH_API_KEY, KVMESH_HASH_SEED (never on the command line, better not in a file).
# engine.kv_cache_memory null: 1 GiB per replica on CPU, 64 MiB for the embedded model."""


COMMON_FLAGS = {
    "the model": ["MODEL", "--served-model-name", "--tokenizer", "--dtype", "--max-model-len", "--chat-template"],
    "where it listens, who may call it": ["--host", "--port", "--api-key"],
    "how many replicas, on what": ["--num-replicas", "--tensor-parallel-size", "--device", "--address"],
    "memory and batching": ["--gpu-memory-utilization", "--kv-cache-memory", "--max-num-seqs",
                            "--max-num-batched-tokens"],
    "tools, reasoning, adapters": ["--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser",
                                   "--enable-lora", "--lora-modules"],
    "routing": ["--policy", "--policy-kwargs"],
    "this run": ["--config", "--print-config", "--verbose", "--help"],
}
"""What ``kvmesh serve --help`` shows, by what users do with them (the rest: --help=all, --help=SECTION)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run a kvmesh cluster (embedded Ray on CPU by default)", add_help=False,
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective config as commented YAML (secrets redacted) and exit")
    parser.add_argument("--verbose", "-v", action="store_true", help="show the replicas' logs")
    add_model_argument(parser)
    add_config_arguments(parser, SERVE_SCHEMA)
    accept_vllm_flags(parser)
    add_grouped_help(parser, COMMON_FLAGS)
    parser.set_defaults(func=run)


def report(message: str) -> None:
    print(f"kvmesh: {message}", flush=True)


def prepare(args: argparse.Namespace) -> ServeConfig | int:
    """The config checked, its notes and warnings said, before Ray starts; or the exit code (an error, or
    ``--print-config`` done)."""
    from kvmesh.cluster.config.flags import ConfigError, config_from_args
    from kvmesh.cluster.config.reference import commented_yaml
    from kvmesh.cluster.launch.preflight import PreflightError, check

    try:
        config = config_from_args(args, SERVE_SCHEMA)
        if args.print_config:
            print(commented_yaml(SERVE_SCHEMA, config, header=EXAMPLE_HEADER), end="")
            return 0
        check(config)  # again inside start(); here so a mistake never reaches the Ray import
    except (ConfigError, PreflightError) as e:
        print(f"kvmesh serve: {e}", file=sys.stderr)
        return 2
    print_vllm_notes(args, "serve")
    if config.router.host != "auto":  # "auto" in a Ray cluster: the node's address, said once it is known
        _warn_open_bind(config, config.router.host)
    return config


def run(args: argparse.Namespace) -> int:
    from kvmesh.replica.openai.malloc_arenas import cap_malloc_arenas

    cap_malloc_arenas()  # serve's router, and what Ray starts here (the replicas) inherit it
    config = prepare(args)
    if isinstance(config, int):
        return config

    from kvmesh.cluster.fleet.deployment_fleet import DeploymentFleet
    from kvmesh.cluster.fleet.operations import Fleet
    from kvmesh.cluster.launch import ray_cluster
    from kvmesh.cluster.launch.launcher import ServeCluster

    ray_cluster.adopt_orphans()  # a Ray process orphaned by a Ctrl-C mid-start is still ours to end
    interrupts = Interrupts()
    interrupts.install()
    cluster = ServeCluster(config, report=report, log_to_driver=args.verbose, admin_keys_dir="",
                           fleet=DeploymentFleet if config.deployments.models else Fleet)
    cluster.cpu_notes = tuple(cpu_notes(args))
    code = 0
    try:
        cluster.start()
        interrupts.install()  # again: a library may have replaced the handlers (connect keeps them past ray.init)
        _print_ready(config, cluster)
        if config.router.host == "auto":  # a Ray cluster's router binds its node's address
            _warn_open_bind(config, urllib.parse.urlsplit(cluster.url).hostname or "")
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        interrupts.ignore()
        report("shutting down...")
        code = interrupts.exit_code or 130
    except Exception as e:  # startup failed: say why, then clean up
        interrupts.ignore()
        if interrupts.pending:  # an interrupt swallowed on the way made start-up fail: that is a Ctrl-C
            report("shutting down...")
            code = interrupts.exit_code or 130
        else:
            print(f"kvmesh serve: {str(e) or repr(e)}", file=sys.stderr, flush=True)
            if not str(e):  # an error with no message says nothing to a person: where it came from does
                traceback.print_exception(e, file=sys.stderr)
            code = 1
    finally:
        interrupts.ignore()  # a second Ctrl-C must not leave orphans
        cluster.stop()
        _stop_ray()  # a ray.init interrupted half-way: cluster.stop() never got its handle
        ray_cluster.end_descendants()
        report("stopped")
    return code


def _warn_open_bind(config: ServeConfig, host: str) -> bool:
    router = config.router
    return warn_open_bind("serve", "the router", host, router.port,
                          keyed=router.api_key is not None or router.admission.keys_file is not None,
                          key_flags="--api-key, or --admission-keys-file")


def _print_ready(config: ServeConfig, cluster: ServeCluster) -> None:
    """The cluster is up: where, what it serves, and the commands to try, watch, change and stop it."""
    rc = config.replicas
    split = f" decode + {rc.num_prefill_replicas} prefill" if rc.num_prefill_replicas else ""
    owner = cluster.state.router.control_url if config.routers.placed else cluster.url  # who changes the set
    models = ", ".join(f"{u.served_model_name} x{u.deployment.num_replicas}" for u in cluster.units)
    print(f"\nkvmesh is ready in {cluster.elapsed_s:.1f}s: {cluster.url}  "
          + (f"(deployments {models}, policy {config.router.policy})\n" if models else
             f"({rc.num_replicas}{split} replicas, policy {config.router.policy}, model "
             f"{cluster.state.served_model_name})\n") +
          f"Try it{' (export KVMESH_API_KEY first)' if config.router.api_key else ''}:\n"
          f"  {cluster.curl_line()}\n"
          f"Status: kvmesh status --url {owner}\n"
          f"Change: kvmesh scale N | drain REPLICA | rollout --url {owner}  (admin key in "
          f"{cluster.admin_key_file}, "
          "mode 0600, removed on exit)\nStop:   Ctrl-C\n", flush=True)


def _stop_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
