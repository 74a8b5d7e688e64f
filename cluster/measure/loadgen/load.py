"""``kvmesh bench load``: argument parsing and the run itself (workload -> requests -> JSON + plots)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from kvmesh.cluster.config.flags import add_config_arguments, config_from_args
from kvmesh.cluster.measure.loadgen.options import BENCH_LOAD_SCHEMA, BenchLoadConfig
from kvmesh.cluster.measure.workloads.prompts import PromptMaker
from kvmesh.cluster.measure.workloads.sessions import Session


def results_dir() -> Path:
    """Where bench results go by default: $KVMESH_RESULTS_DIR, else ~/.cache/kvmesh/results (never the repo)."""
    import os

    return Path(os.environ.get("KVMESH_RESULTS_DIR") or Path.home() / ".cache" / "kvmesh" / "results")


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The settings' flags (derived from ``options.BenchLoadConfig``), where the results go, and the registered
    workloads listed under the flags (the parser formats its epilog raw)."""
    from kvmesh.cluster.measure.workloads.registry import describe

    add_config_arguments(p, BENCH_LOAD_SCHEMA, config_file=False)
    p.epilog = describe()
    o = p.add_argument_group("output")
    o.add_argument("--out", default=str(results_dir() / "bench_load.json"),
                   help="JSON results, a PNG beside it (default: %(default)s; KVMESH_RESULTS_DIR moves the folder)")
    o.add_argument("--label", default=None, help="name of this run in the report (default: the workload)")
    o.add_argument("--no-plot", action="store_true")
    o.add_argument("--no-progress", action="store_true")


def build_parser(prog: str = "kvmesh bench load") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Load-test an OpenAI-compatible endpoint with streaming requests;\n"
                                "reports TTFT, inter-token and end-to-end latency, throughput, errors and the\n"
                                "cached-token share.")
    add_load_arguments(p)
    return p


def build_sessions(config: BenchLoadConfig, maker: PromptMaker) -> list[Session]:
    """The registered workload's records, rendered into sessions (``workloads.sessions.render``)."""
    from kvmesh.cluster.measure.workloads.registry import get_workload
    from kvmesh.cluster.measure.workloads.sessions import render

    w = config.workload
    entry = get_workload(w.workload)
    rendering = w.rendering(entry, maker, config.endpoint.prompt_format == "text")
    records = entry.make(w.settings(entry, config.shape))
    return render(records, rendering, entry.conversation, max_sessions=w.num_requests if entry.conversation else None)


async def run_async(args: argparse.Namespace, cache_salt: str | None = None) -> dict:
    """Run the load test ``args`` describe; returns {"label", "summary", "requests", "config"}. Raises on bad input."""
    return await run_bench(config_from_args(args, BENCH_LOAD_SCHEMA), args.label, not args.no_progress, cache_salt)


async def run_bench(config: BenchLoadConfig, label: str | None = None, progress: bool = True,
                    cache_salt: str | None = None) -> dict:
    """Run one load test; returns {"label", "summary", "requests", "config"}. Raises on bad input."""
    from kvmesh.cluster.measure.loadgen.client import measure_tokens_per_word, open_session, preflight
    from kvmesh.cluster.measure.loadgen.report import summarize
    from kvmesh.cluster.measure.loadgen.runner import run_load
    from kvmesh.cluster.measure.loadgen.session import RequestOptions
    from kvmesh.cluster.measure.workloads.prompts import sample_text
    from kvmesh.router.routing.receipts import HEADER_OPT_IN
    from tqdm import tqdm

    endpoint, w, lo = config.endpoint, config.workload, config.load
    if endpoint.api == "chat" and endpoint.prompt_format != "text":
        raise ValueError("--api chat needs --prompt-format text (chat messages are text)")
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    if endpoint.receipts:
        headers[HEADER_OPT_IN] = "1"
    async with open_session(endpoint.url, headers, read_timeout_s=lo.timeout) as client:
        model = await preflight(client, endpoint.url, endpoint.model)
        tpw = w.tokens_per_word
        if tpw is None and endpoint.prompt_format == "text":
            tpw = await measure_tokens_per_word(client, model, sample_text())
        maker = PromptMaker(w.vocab_size, tokens_per_word=tpw or 2.0)
        sessions = build_sessions(config, maker)
        options = RequestOptions(model, endpoint.api, ignore_eos=lo.ignore_eos,
                                 cache_salt=cache_salt if cache_salt is not None else lo.cache_salt)
        total = sum(len(s.turns) for s in sessions)
        label = label or w.workload
        with tqdm(total=total, desc=f"bench {label}", unit="req", disable=not progress) as bar:
            results, wall, counters = await run_load(client, sessions, options, maker, lo, w,
                                                     on_result=lambda _: bar.update(1))
    settings = config.flat() | {"label": label, "model": model, "tokens_per_word": maker.tokens_per_word,
                                "cache_salt": options.cache_salt}
    return {"label": label, "config": settings, "summary": summarize(results, wall, counters),
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
    from kvmesh.cluster.measure.loadgen.client import EndpointUnreachable
    from kvmesh.cluster.measure.loadgen.plots import plot_run
    from kvmesh.cluster.measure.loadgen.report import format_summary, write_json
    from kvmesh.cluster.measure.workloads.traces import TraceError

    try:
        run = asyncio.run(run_async(args))
    except (EndpointUnreachable, TraceError, ValueError) as e:
        print(f"kvmesh bench load: {e}", file=sys.stderr)
        return 2
    out = write_json(run, args.out)
    print(format_summary(run["label"], run["summary"]))
    written = [str(out)]
    if not args.no_plot and not _have_matplotlib():
        print("no plot: matplotlib is not installed (the plots extra: pip install '.[plots]')", file=sys.stderr)
    elif not args.no_plot:
        written.append(str(plot_run(run["requests"], f"kvmesh bench load: {run['label']} @ {run['config']['url']}",
                                    Path(args.out).with_suffix(".png"), params=run_parameters(run["config"]),
                                    summary=run["summary"])))
    print("wrote " + " and ".join(written))
    return 0 if run["summary"]["ok"] else 1


def _have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
