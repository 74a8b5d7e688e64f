"""kvmesh's router side by side with the peer routers installed here, in one interleaved run.

    kvmesh bench router-peers [--peers-dir DIR] [--out results/router_peers.json] [--quick]

Two instant stub replicas (cluster/measure/benchmarks/support/fake_replica.py) serve every router. Peers are found
as ``DIR/*/bin/sglang-router`` and ``DIR/*/bin/vllm-router`` (DIR: ``--peers-dir``, else
``$KVMESH_PEERS_DIR``, else ``../peers`` beside the checkout; each in its own virtualenv, outside the
repository); what is missing is skipped and said so. Each router runs alone on core 0 (taskset),
the stubs and the load on core 1. Per router and workload, interleaved over rounds:

    cpu_ms_per_request   the router's process tree CPU (/proc) / requests, at saturation
    requests_per_s       wrk, one thread, 64 keep-alive clients, closed loop
    added_p50/p99_ms     one client: router minus direct-to-replica latency, alternating

Workloads (stories260K tokenizer; 4 output tokens): ``text`` 1,000-token completions (8 shared
~950-token prefixes x 64 suffixes), ``token_ids`` the same prompts as token ids, ``chat`` 32
conversations of 8 turns that resend a growing history (Llama-2 chat template, whose ``<s>``/
``</s>`` mark the turns). Peers run ``cache_aware`` with their defaults (they do not tokenize).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peer_load import (
    added_latency,
    free_port,
    pinned,
    run_wrk,
    shutil,
    start_stub_replicas,
    stop_processes,
    tree_cpu_seconds,
    wait_http,
)
from kvmesh.cluster.measure.shared_dir import stories_model

ROOT = Path(__file__).resolve().parents[3]
STORIES = stories_model()
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
WORDS = ["once", "upon", "a", "time", "there", "was", "a", "little", "girl", "who", "loved", "to", "play", "in", "the",
         "park", "with", "her", "dog", "and", "one", "day", "she", "found", "a", "big", "red", "ball", "under", "an",
         "old", "tree", "near", "the", "river", "so", "she", "ran", "home", "to", "tell", "mom"]
PATHS = {"text": "/v1/completions", "token_ids": "/v1/completions", "chat": "/v1/chat/completions"}


def _words(rng: random.Random, tok, num_tokens: int) -> str:
    """Random story words, as many as fit in ``num_tokens`` tokens (within ~1%)."""
    words = [rng.choice(WORDS) for _ in range(num_tokens)]  # >= 1 token each: too many
    while len(tok.encode(" ".join(words), add_special_tokens=False)) > num_tokens:
        words = words[: max(int(len(words) * 0.99), len(words) - 1)]
    return " ".join(words)


def workloads(tok) -> dict[str, list[str]]:
    """JSON request bodies per workload, in the order they are sent."""
    rng = random.Random(0)
    prefixes = [_words(rng, tok, 950) for _ in range(8)]
    prompts = [f"{p} {_words(rng, tok, 45)}" for _ in range(64) for p in prefixes]
    text = [json.dumps({"model": "stub", "prompt": p, "max_tokens": 4}) for p in prompts]
    ids = [json.dumps({"model": "stub", "prompt": tok.encode(p, add_special_tokens=True), "max_tokens": 4})
           for p in prompts]
    system = _words(rng, tok, 200)
    convs = [[{"role": "system", "content": system}] for _ in range(32)]
    chat = []
    for _ in range(8):  # turn-major: every conversation's turn t before any turn t+1
        for conv in convs:
            conv.append({"role": "user", "content": _words(rng, tok, 60)})
            chat.append(json.dumps({"model": "stub", "messages": list(conv), "max_tokens": 4}))
            conv.append({"role": "assistant", "content": _words(rng, tok, 60)})
    return {"text": text, "token_ids": ids, "chat": chat}


def router_commands(args, replicas: list[str], template_file: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """name -> command line (without --port) of every router to run, and name -> why skipped."""
    kvmesh = [sys.executable, "-m", "kvmesh.cluster.cli", "router", "--model", str(args.model), "--max-model-len",
              "8192", "--chat-template", template_file, "--log-level", "warning", "--host", "127.0.0.1"]
    kvmesh += [x for url in replicas for x in ("--replica", url)]
    found = {"kvmesh": kvmesh, "kvmesh-no-tokenize-cache": [*kvmesh, "--tokenize-cache-tokens", "0"],
             "kvmesh-no-admission": [*kvmesh, "--no-admission-enabled"]}
    if args.workers > 1:
        found[f"kvmesh-{args.workers}-workers"] = [*kvmesh, "--workers", str(args.workers)]
    skipped = {}
    peers_dir = Path(args.peers_dir or os.environ.get("KVMESH_PEERS_DIR") or ROOT.parent / "peers")
    for name, exe, extra in (("sglang-router", "sglang-router", ["launch"]), ("vllm-router", "vllm-router", [])):
        hits = sorted(peers_dir.glob(f"*/bin/{exe}"))
        if not hits:
            skipped[name] = f"no {peers_dir}/*/bin/{exe} (pip install {name} into a venv there)"
            continue
        found[name] = [str(hits[0]), *extra, "--worker-urls", *replicas, "--policy", "cache_aware",
                       "--host", "127.0.0.1", "--log-level", "warn" if name == "sglang-router" else "warning",
                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    return found, skipped


def measure(args, routers: dict, bodies: dict, direct: str, rounds: int) -> list[dict]:
    rows = []
    for rnd in range(rounds):
        for workload, items in bodies.items():
            for name, (proc, url) in routers.items():
                path = PATHS[workload]
                added_latency(url, direct, path, items, min(len(items), 64))  # warm: connections, caches
                cpu0 = tree_cpu_seconds(proc.pid)
                sat = run_wrk(url, path, items, 64, args.duration, cpu=1)
                cpu = tree_cpu_seconds(proc.pid) - cpu0
                lat = added_latency(url, direct, path, items, args.latency_requests)
                row = {"round": rnd, "router": name, "workload": workload, **lat,
                       "requests_per_s": sat["requests"] / sat["duration_s"], "saturation": sat,
                       "cpu_ms_per_request": 1e3 * cpu / max(sat["requests"], 1)}
                rows.append(row)
                print(f"  round {rnd} {workload:<9} {name:<26} {row['cpu_ms_per_request']:6.3f} ms CPU/req "
                      f"{row['requests_per_s']:7.0f} req/s  +{row['added_p50_ms']:.2f} ms p50  "
                      f"errors {sat['socket_errors'] + sat['status_errors'] + lat['errors']}", flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    import statistics

    out: dict = {}
    for row in rows:
        out.setdefault(row["router"], {}).setdefault(row["workload"], []).append(row)
    keys = ("cpu_ms_per_request", "requests_per_s", "added_p50_ms", "added_p99_ms")

    def one(xs: list[dict]) -> dict:
        sent = sum(x["saturation"]["requests"] + x["requests"] for x in xs)
        failed = sum(x["saturation"]["socket_errors"] + x["saturation"]["status_errors"] + x["errors"] for x in xs)
        if failed > sent / 2:  # e.g. a router that rejects token-id prompts: its numbers measure errors
            return {"unsupported": f"{failed} of {sent} requests failed"}
        return {**{k: statistics.median(x[k] for x in xs) for k in keys}, "failed_requests": failed}

    return {r: {w: one(xs) for w, xs in ws.items()} for r, ws in out.items()}


ROW_LABELS = {"kvmesh": "**kvmesh**", "kvmesh-no-tokenize-cache": "kvmesh, tokenize cache off",
              "kvmesh-no-admission": "kvmesh, admission off (`--no-admission-enabled`)"}
"""How the table names a router run (the rest: ``kvmesh-N-workers`` and the peers, below)."""
COLUMNS = {"text": "text, 995 tokens", "token_ids": "the same prompts as token ids", "chat": "chat, growing history"}
"""How the table names a workload."""


def table(result: dict) -> str:
    """The results file as BENCHMARKS' table: a row per router run, a column per workload; CPU ms per request
    (requests/s at saturation; added latency p50, and p99 for kvmesh and the peers)."""
    summary = result["summary"]
    work = list(result["workloads"])
    heads = " | ".join(COLUMNS.get(w, w) for w in work)
    lines = [f"| router CPU ms / request (req/s at saturation; added p50 / p99, one client) | {heads} |",
             "|---" * (len(work) + 1) + "|"]
    for name, by_workload in summary.items():
        label = ROW_LABELS.get(name) or (f"kvmesh `--workers {name.split('-')[1]}` (both on core 0)"
                                         if name.startswith("kvmesh-") else name)
        full = not name.startswith("kvmesh-")  # the variants show p50 alone
        lines.append(f"| {label} | " + " | ".join(_cell(by_workload[w], name == "kvmesh", full) for w in work) + " |")
    return "\n".join(lines)


def _cell(s: dict, bold: bool, full: bool) -> str:
    if "unsupported" in s:
        return "rejects token-id prompts (400)"
    cpu = f"{s['cpu_ms_per_request']:.3f}"
    lat = f"+{s['added_p50_ms']:.2f} / {s['added_p99_ms']:.2f} ms" if full else f"+{s['added_p50_ms']:.2f} ms"
    return f"{f'**{cpu}**' if bold else cpu} ({s['requests_per_s']:,.0f}/s; {lat})"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = list(summary)
    work = list(next(iter(summary.values())))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label) in zip(axes, (("cpu_ms_per_request", "router CPU ms / request (lower is better)"),
                                       ("requests_per_s", "requests/s on one core, 64 clients"),
                                       ("added_p50_ms", "added latency p50, one client (ms)")), strict=True):
        width = 0.8 / len(routers)
        for i, r in enumerate(routers):
            values = [summary[r].get(w, {}).get(key, float("nan")) for w in work]  # nan: unsupported
            ax.bar([w + i * width for w in range(len(work))], values, width, label=r)
        ax.set_xticks([w + 0.4 - width / 2 for w in range(len(work))], work)
        ax.set_title(label, fontsize=10)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(routers), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench router-peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/router_peers.json", help="results JSON (a .png beside it)")
    ap.add_argument("--peers-dir", help="folder of virtualenvs holding peer routers (default $KVMESH_PEERS_DIR, "
                                        "else ../peers beside the checkout)")
    ap.add_argument("--model", default=STORIES, help="tokenizer for kvmesh's router and the workloads")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians are reported)")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of saturation per measurement")
    ap.add_argument("--latency-requests", type=int, default=300, help="one-client requests per measurement")
    ap.add_argument("--workers", type=int, default=2, help="also run kvmesh with this many workers (1: skip)")
    ap.add_argument("--quick", action="store_true", help="1 round, 2 s, 100 requests (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.latency_requests = 1, 2.0, 100
    if shutil.which("wrk") is None:
        print("kvmesh bench router-peers: needs wrk for the saturation load (apt-get install wrk)", file=sys.stderr)
        return 2
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model, max_model_len=8192)
    bodies = workloads(tok)
    os.sched_setaffinity(0, {1}) if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1 else None
    procs, routers = [], {}
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(LLAMA2_CHAT_TEMPLATE)
    try:
        stubs = start_stub_replicas(procs)
        commands, skipped = router_commands(args, stubs, f.name)
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
        for name, cmd in commands.items():
            port = free_port()
            log = open(Path(tempfile.gettempdir()) / f"kvmesh-bench-{name}.log", "w")  # noqa: SIM115
            p = subprocess.Popen(pinned([*cmd, "--port", str(port)], 0), stdout=log, stderr=subprocess.STDOUT)
            procs.append(p)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_http(url, proc=p)
            except RuntimeError as e:
                raise RuntimeError(f"{e}; its output is in {log.name}") from None
            routers[name] = (p, url)
            print(f"found {name}: {cmd[0] if 'kvmesh' not in name else 'this checkout'} on {url}", flush=True)
        time.sleep(1.0)  # first health polls settle
        rows = measure(args, routers, bodies, stubs[0], args.rounds)
    finally:
        stop_processes(procs, 15)
        os.unlink(f.name)
    summary = summarize(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"routers": {n: " ".join(map(str, c)) for n, c in commands.items()}, "skipped": skipped,
              "workloads": {w: {"requests": len(b), "path": PATHS[w]} for w, b in bodies.items()},
              "setup": {"rounds": args.rounds, "duration_s": args.duration, "clients": 64,
                        "latency_requests": args.latency_requests, "router_core": 0, "load_core": 1},
              "summary": summary, "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    plot(summary, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0
