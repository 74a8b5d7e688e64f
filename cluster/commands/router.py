"""``kvmesh router``: the KV-cache-aware router in front of any set of replicas.

    kvmesh router --model PATH --replica http://127.0.0.1:8100,events=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558 \\
                  --replica http://127.0.0.1:8101,events=tcp://127.0.0.1:5559,replay=tcp://127.0.0.1:5560

Works in front of kvmesh replicas and of vLLM servers started with KV events on
(``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``). A replica
without ``events=`` is routed by load only.
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("router", help="run the KV-cache-aware router (OpenAI API) in front of replicas",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replica", action="append", default=[], metavar="URL[,events=tcp://H:P,replay=tcp://H:P,name=ID]",
                   help="a replica to route to (repeat; more can be added at runtime with POST /replicas)")
    p.add_argument("--policy", default="cache_aware",
                   help="routing policy: cache_aware (default), round_robin, least_loaded, random, prefix_hash")
    p.add_argument("--policy-args", default="{}", metavar="JSON",
                   help='policy options as JSON, e.g. \'{"decode_weight": 8, "temperature": 0}\'')
    p.add_argument("--model", help="model path or hub id (its tokenizer must be the replicas')")
    p.add_argument("--tokenizer", help="tokenizer path if not the model's")
    p.add_argument("--served-model-name", help="name clients send in 'model' (others get 404)")
    p.add_argument("--max-model-len", type=int, help="context length for validation (default: the model's)")
    p.add_argument("--block-size", type=int, default=16, help="the replicas' KV block size (default 16)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--replica-api-key", help="bearer token to send to the replicas")
    p.add_argument("--predict-ttl", type=float, default=2.0,
                   help="seconds a routed request's blocks count as cached before events confirm them")
    p.add_argument("--poll-interval", type=float, default=0.5, help="seconds between /health + /load polls")
    p.add_argument("--max-attempts", type=int, default=3, help="replicas tried per request before giving up")
    p.add_argument("--chat-template", help="Jinja chat template (file or text) if not the model's")
    p.add_argument("--tokenize-cache-tokens", type=int, default=1 << 20,
                   help="token ids kept by the tokenize cache (0 turns it off; default 1048576)")
    p.add_argument("--workers", type=int, default=1,
                   help="router processes sharing the port, each with its own index (default 1)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run)


def run(args) -> int:
    import logging

    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.server import RouterServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        policy_kwargs = json.loads(args.policy_args)
        specs = [ReplicaSpec.parse(text) for text in args.replica]
        config = RouterConfig(
            host=args.host, port=args.port, model=args.model, tokenizer=args.tokenizer,
            served_model_name=args.served_model_name, max_model_len=args.max_model_len, policy=args.policy,
            policy_kwargs=policy_kwargs, block_size=args.block_size, api_key=args.api_key,
            replica_api_key=args.replica_api_key, predict_ttl_s=args.predict_ttl,
            poll_interval_s=args.poll_interval, max_attempts=args.max_attempts, workers=args.workers,
            chat_template=args.chat_template, tokenize_cache_tokens=args.tokenize_cache_tokens)
        if config.workers > 1:
            from kvmesh.router.workers import router_workers

            server = router_workers(config, specs, config.workers)
        else:
            server = RouterServer(config, specs)
    except (ValueError, TypeError) as e:
        print(f"kvmesh router: {e}")
        return 2
    if config.model is None and config.tokenizer is None:
        logging.warning("no --model/--tokenizer: routing by load only (no prefix cache awareness)")
    logging.info("router on http://%s:%d, %d replicas, policy %s, %d worker(s)", config.host, config.port,
                 len(specs), config.policy, config.workers)
    return server.run() or 0
