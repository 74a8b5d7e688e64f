"""``kvmesh replica``: run one replica on its own, without the rest of the cluster.

TP=1 runs in this process without Ray; TP>1 starts a local Ray instance for the worker ranks.
Ports default to DESIGN.md's (HTTP 8100, events 5557, replay 5558); 0 picks free ones, and the
actual addresses are printed as one JSON line on stdout once the replica serves.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "replica", help="serve one model replica (OpenAI HTTP + KV events) without the cluster",
        description="Serve one engine replica: OpenAI-compatible HTTP, Prometheus /metrics, /load for "
                    "routers, and the KV event stream (ZeroMQ PUB + replay/snapshot).")
    p.add_argument("--model", required=True, help="Hugging Face directory or hub id")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory or id (default: the model's)")
    p.add_argument("--served-model-name", default=None, help="name clients use in 'model' (default: --model)")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                   help="tensor-parallel ranks (>1 starts a local Ray instance)")
    p.add_argument("--host", default="127.0.0.1", help="address for HTTP and events (default: %(default)s)")
    p.add_argument("--port", type=int, default=8100, help="HTTP port, 0 = free port (default: %(default)s)")
    p.add_argument("--event-port", type=int, default=5557, help="KV event PUB port (default: %(default)s)")
    p.add_argument("--replay-port", type=int, default=5558, help="replay/snapshot port (default: %(default)s)")
    p.add_argument("--events-endpoint", default=None,
                   help="full PUB endpoint instead of --host/--event-port (e.g. connect://tcp://collector:5557)")
    p.add_argument("--no-events", action="store_true", help="publish no KV events")
    p.add_argument("--api-key", default=os.environ.get("KVMESH_API_KEY"),
                   help="bearer token required on /v1/* (default: $KVMESH_API_KEY, else none)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"])
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache bytes on CPU (default 1 GiB)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def engine_config_from_args(args: argparse.Namespace):
    from kvmesh.replica.config import EngineConfig

    return EngineConfig(
        model=args.model, tokenizer=args.tokenizer, dtype=args.dtype, load_format=args.load_format,
        block_size=args.block_size, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=not args.no_prefix_caching,
        tensor_parallel_size=args.tp, device=args.device, seed=args.seed,
        hash_seed=os.environ.get("KVMESH_HASH_SEED") or None,
        kv_events_endpoint=args.events_endpoint,
        kv_events_replay_endpoint=f"tcp://{args.host}:{args.replay_port}" if args.events_endpoint else None)


def run(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.tp < 1:
        print(f"--tp must be >= 1, got {args.tp}", file=sys.stderr)
        return 2
    try:
        config = engine_config_from_args(args)
    except ValueError as e:
        print(f"kvmesh replica: {e}", file=sys.stderr)
        return 2
    if args.tp > 1:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=max(args.tp + 1, 2), include_dashboard=False, configure_logging=False)
    from kvmesh.replica.server_runtime import ReplicaRuntime

    event_port = None if (args.no_events or args.events_endpoint) else args.event_port
    runtime = ReplicaRuntime.start(config, host=args.host, http_port=args.port, event_port=event_port,
                                   replay_port=args.replay_port, api_key=args.api_key,
                                   served_model_name=args.served_model_name)
    print(json.dumps(runtime.endpoints()), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        reason = runtime.broken_reason()
        if reason is not None:
            print(f"kvmesh replica: stopping, the replica is broken: {reason}", file=sys.stderr)
            runtime.shutdown(graceful_s=0)
            return 1
    runtime.shutdown(graceful_s=10)
    return 0
