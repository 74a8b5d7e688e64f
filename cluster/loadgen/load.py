"""``kvmesh bench load``: argument parsing and the run itself (workload -> requests -> JSON + plots)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from kvmesh.cluster.loadgen.workloads import WORKLOADS


def results_dir() -> Path:
    """Where bench results go by default: $KVMESH_RESULTS_DIR, else ~/.cache/kvmesh/results (never the repo)."""
    import os

    return Path(os.environ.get("KVMESH_RESULTS_DIR") or Path.home() / ".cache" / "kvmesh" / "results")


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="OpenAI endpoint base URL (default: %(default)s)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default=None, help="bearer token for servers started with --api-key")
    p.add_argument("--api", choices=("completions", "chat"), default="completions")
    p.add_argument("--prompt-format", choices=("tokens", "text"), default="tokens",
                   help="token-id lists (exact lengths, completions only) or words (default: tokens)")
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default="chatbot")
    w.add_argument("--num-requests", type=int, default=64,
                   help="requests (sessions for multi_turn); traces: the first N records (default: 64)")
    w.add_argument("--max-prompt-tokens", type=int, default=384,
                   help="token budget of a prompt; keep prompt + --max-tokens within the model's context")
    w.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request (default: 32)")
    w.add_argument("--num-prefixes", type=int, default=4, help="chatbot: distinct system prompts (default: 4)")
    w.add_argument("--system-share", type=float, default=None,
                   help="share of the budget taken by the system prompt (chatbot 0.75, multi_turn 0.25)")
    w.add_argument("--turns", type=int, default=4, help="multi_turn: turns per conversation (default: 4)")
    w.add_argument("--num-documents", type=int, default=None, help="rag: document pool size (default: unique)")
    w.add_argument("--trace", default=None, help="mooncake JSONL or azure CSV (workloads mooncake/azure)")
    w.add_argument("--trace-block-tokens", type=int, default=16,
                   help="mooncake: tokens generated per hash_id (trace blocks are 512; default: 16)")
    w.add_argument("--length-scale", type=float, default=1.0, help="azure: multiply trace lengths (default: 1)")
    w.add_argument("--time-scale", type=float, default=1.0, help="traces: multiply timestamps (0.5 = 2x rate)")
    w.add_argument("--vocab-size", type=int, default=512, help="token ids are drawn below this (default: 512)")
    w.add_argument("--tokens-per-word", type=float, default=None,
                   help="text prompts: tokens per word (default: measured with POST /tokenize, else 2.0)")
    w.add_argument("--seed", type=int, default=0)
    lo = p.add_argument_group("load")
    lo.add_argument("--mode", choices=("open", "closed"), default="closed")
    lo.add_argument("--rate", type=float, default=None,
                    help="open loop: sessions/s, Poisson (default for traces: their timestamps)")
    lo.add_argument("--concurrency", type=int, default=None,
                    help="closed loop: sessions in flight (default 8); open loop: cap on requests in flight "
                         "(default 0 = none, arrivals are never delayed)")
    lo.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                    help="send no new request after SECONDS (in-flight ones finish); with a large "
                         "--num-requests this runs for a fixed time (default: until the workload ends)")
    lo.add_argument("--think-time", type=float, default=0.0, help="seconds between turns of a session")
    lo.add_argument("--timeout", type=float, default=300.0, help="per-request timeout in seconds")
    lo.add_argument("--cache-salt", default=None, help="send this cache_salt with every request")
    lo.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (strict OpenAI servers)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=str(results_dir() / "bench_load.json"),
                   help="JSON results, a PNG beside it (default: %(default)s; KVMESH_RESULTS_DIR moves the folder)")
    o.add_argument("--label", default=None, help="name of this run in the report (default: the workload)")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--no-progress", action="store_true")


def build_parser(prog: str = "kvmesh bench load") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description="Load-test an OpenAI-compatible endpoint with streaming "
                                "requests; reports TTFT, inter-token and end-to-end latency, throughput, "
                                "errors and the cached-token share.")
    add_load_arguments(p)
    return p


def build_sessions(args, maker):
    from kvmesh.cluster.benchmarks.traces import read_azure, read_mooncake
    from kvmesh.cluster.loadgen import workloads as wl

    budget = wl.Budget(args.max_prompt_tokens, args.max_tokens)
    as_text = args.prompt_format == "text"
    n, seed = args.num_requests, args.seed
    if args.workload == "chatbot":
        return wl.chatbot(n, budget, maker, as_text, num_prefixes=args.num_prefixes,
                          system_share=args.system_share or 0.75, seed=seed)
    if args.workload == "multi_turn":
        return wl.multi_turn(n, budget, maker, as_text, num_turns=args.turns,
                             system_share=args.system_share or 0.25, seed=seed)
    if args.workload == "rag":
        return wl.rag(n, budget, maker, as_text, num_documents=args.num_documents, seed=seed)
    if args.workload == "random":
        return wl.random_prompts(n, budget, maker, as_text, seed=seed)
    if not args.trace:
        raise ValueError(f"--workload {args.workload} needs --trace PATH")
    if args.workload == "mooncake":
        return wl.mooncake(read_mooncake(args.trace, limit=n), budget, maker, as_text,
                           trace_block_tokens=args.trace_block_tokens, time_scale=args.time_scale, seed=seed)
    return wl.azure(read_azure(args.trace, limit=n), budget, maker, as_text,
                    length_scale=args.length_scale, time_scale=args.time_scale, seed=seed)


async def run_async(args, cache_salt: str | None = None) -> dict:
    """Run one load test; returns {"label", "summary", "requests", "config"}. Raises on bad input."""
    from kvmesh.cluster.loadgen.client import measure_tokens_per_word, open_session, preflight
    from kvmesh.cluster.loadgen.prompts import PromptMaker, sample_text
    from kvmesh.cluster.loadgen.report import summarize
    from kvmesh.cluster.loadgen.runner import LoadConfig, run_load
    from kvmesh.cluster.loadgen.session import RequestOptions
    from tqdm import tqdm

    if args.api == "chat" and args.prompt_format != "text":
        raise ValueError("--api chat needs --prompt-format text (chat messages are text)")
    concurrency = args.concurrency if args.concurrency is not None else (8 if args.mode == "closed" else 0)
    load = LoadConfig(mode=args.mode, rate=args.rate, concurrency=concurrency, think_time_s=args.think_time,
                      max_prompt_tokens=args.max_prompt_tokens, seed=args.seed, duration_s=args.duration)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with open_session(args.url, headers, read_timeout_s=args.timeout) as client:
        model = await preflight(client, args.url, args.model)
        tpw = args.tokens_per_word
        if tpw is None and args.prompt_format == "text":
            tpw = await measure_tokens_per_word(client, model, sample_text())
        maker = PromptMaker(args.vocab_size, tokens_per_word=tpw or 2.0)
        sessions = build_sessions(args, maker)
        options = RequestOptions(model, args.api, ignore_eos=not args.no_ignore_eos,
                                 cache_salt=cache_salt if cache_salt is not None else args.cache_salt)
        total = sum(len(s.turns) for s in sessions)
        label = args.label or args.workload
        with tqdm(total=total, desc=f"bench {label}", unit="req", disable=args.no_progress) as bar:
            results, wall, counters = await run_load(client, sessions, options, maker, load,
                                                     on_result=lambda _: bar.update(1))
    config = {k: v for k, v in vars(args).items() if k not in ("func", "api_key") and not callable(v)}
    config.update(model=model, tokens_per_word=maker.tokens_per_word, cache_salt=options.cache_salt)
    return {"label": label, "config": config, "summary": summarize(results, wall, counters),
            "requests": [r.to_json() for r in sorted(results, key=lambda r: r.start_s)]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_and_write(args)


def run_parameters(config: dict) -> str:
    """One line of the settings that shape a run, for plot titles."""
    keys = ("workload", "api", "mode", "rate", "concurrency", "num_requests", "duration", "max_prompt_tokens",
            "max_tokens", "model")
    return ", ".join(f"{k}={config[k]}" for k in keys if config.get(k) is not None)


def run_and_write(args) -> int:
    from kvmesh.cluster.benchmarks.traces import TraceError
    from kvmesh.cluster.loadgen.client import EndpointUnreachable
    from kvmesh.cluster.loadgen.plots import plot_run
    from kvmesh.cluster.loadgen.report import format_summary, write_json

    try:
        run = asyncio.run(run_async(args))
    except (EndpointUnreachable, TraceError, ValueError) as e:
        print(f"kvmesh bench load: {e}", file=sys.stderr)
        return 2
    out = write_json(run, args.out)
    print(format_summary(run["label"], run["summary"]))
    written = [str(out)]
    if not args.no_plot and not _have_matplotlib():
        print("no plot: matplotlib is not installed (pip install 'kvmesh[plots]')", file=sys.stderr)
    elif not args.no_plot:
        written.append(str(plot_run(run["requests"], f"kvmesh bench load: {run['label']} @ {args.url}",
                                    Path(args.out).with_suffix(".png"), params=run_parameters(run["config"]),
                                    summary=run["summary"])))
    print("wrote " + " and ".join(written))
    return 0 if run["summary"]["ok"] else 1


def _have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
