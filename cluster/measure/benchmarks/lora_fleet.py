"""A live check of LoRA adapters through ``kvmesh serve``: follow-ups cached, adapters loaded at runtime.

    kvmesh bench lora-fleet [--replicas 2] [--adapters 8] [--clients 8] [--conversations 96] [--runtime-loads 3]
                            [--out results/bench_lora_fleet.json]

Writes ``--adapters`` PEFT adapters of the model (random A and B, rank 8, every projection; support/peft_writer.py)
and a fleet config with one deployment serving them from the start, then runs ``kvmesh serve --config`` (a real
process: its own local Ray, replicas, the router on a free loopback port). Under load from ``--clients`` concurrent
clients it plays ``--conversations`` two-turn conversations, each with one adapter (Zipf ``--zipf`` popularity): a
fresh prompt, then its follow-up (the prompt, the answer's tokens and a new question). A follow-up **comes back
cached** when the replica reports at least the first turn's whole prompt blocks as cached (``usage``'s
``cached_tokens``). Every request asks for the router's route receipt (``x-kvmesh-receipt``), so a follow-up
that is not cached says why: **diverted** (the router sent it away from a replica holding its first prompt: a choice
of the cost) or **lost** (sent where the router expected the prefix, or with the prefix known nowhere, and not found
cached: a fault, never a choice; none may be). Mid-load, ``--runtime-loads`` adapters not served before are added
with the router's ``POST /v1/load_lora_adapter`` (the admin key serve wrote, what ``kvmesh lora load`` sends) and a
request for each is sent the moment the call answers: the time from the call to that request's first token is how
soon an adapter loaded at runtime serves. Each runtime adapter's greedy tokens are checked to differ from the base
model's (the adapter is applied). Prints the verdict; writes every request and the summary to ``--out`` with a plot
beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from kvmesh.cluster.measure.benchmarks.support.peer_load import free_port
from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter
from kvmesh.cluster.measure.benchmarks.support.serve_fleet import ServeProcess
from kvmesh.cluster.measure.shared_dir import stories_model
from kvmesh.router.routing.receipts import (
    HEADER_BEST,
    HEADER_OPT_IN,
    HEADER_PREDICTED,
    HEADER_REASON,
    HEADER_REPLICA,
)

CACHED_SHARE_TARGET = 0.95
RUNTIME_LOAD_TARGET_S = 1.0
SERVED = "stories"
BLOCK_SIZE = 16
"""The engine's block size in the fleet config: a follow-up counts as cached by whole blocks of its first prompt."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvmesh bench lora-fleet", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(stories_model()), help="the base model (default: stories260K)")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--adapters", type=int, default=8, help="adapters served from the start")
    ap.add_argument("--max-loras", type=int, default=4, help="adapters in one step's batch (engine.max_loras)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument("--conversations", type=int, default=96, help="two-turn conversations in all")
    ap.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the adapters' popularity")
    ap.add_argument("--prompt-tokens", type=int, default=160, help="the first turn's prompt")
    ap.add_argument("--question-tokens", type=int, default=16, help="new tokens of the follow-up")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens of each answer")
    ap.add_argument("--runtime-loads", type=int, default=3, help="adapters loaded mid-load through the router")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=120.0, help="one request's limit")
    ap.add_argument("--out", default="results/bench_lora_fleet.json")
    return ap


def fleet_config(args, adapters: dict[str, str], port: int) -> dict:
    """``kvmesh serve --config``'s file: one deployment of the model serving ``adapters`` from the start."""
    return {
        "engine": {"kv_cache_memory": "32MiB", "max_lora_rank": 8, "block_size": BLOCK_SIZE},
        "deployments": {"models": [{"model": args.model, "served_model_name": SERVED, "num_replicas": args.replicas,
                                    "adapters": adapters, "engine": {"max_loras": args.max_loras}}]},
        "replicas": {"http_port": 0, "event_port": 0},
        "router": {"host": "127.0.0.1", "port": port, "workers": 1},
    }


async def complete(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], max_tokens: int,
                   timeout_s: float) -> dict:
    """One streamed greedy completion of token ids: its status, TTFT, total time, answer tokens, cached tokens and
    the router's route receipt (``route_receipt``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    rec: dict = {"model": model, "prompt_tokens": len(prompt), "status": 0, "ttft_s": None, "tokens": [],
                 "cached_tokens": None}
    t0 = time.monotonic()
    try:
        async with session.post(url + "/v1/completions", json=body, headers={HEADER_OPT_IN: "1"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            rec["status"], rec["route"] = r.status, route_receipt(r.headers)
            if r.status != 200:
                rec["error"] = (await r.text())[:200]
                return rec
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    if choice.get("token_ids"):
                        rec["ttft_s"] = rec["ttft_s"] or time.monotonic() - t0
                        rec["tokens"] += choice["token_ids"]
                usage = chunk.get("usage")
                if usage:
                    rec["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["total_s"] = time.monotonic() - t0
    return rec


def route_receipt(headers) -> dict:
    """The route receipt's headers of an answer: the replica, why it was chosen, the prompt tokens the router expected
    it to find cached and the most any candidate held (an answer without them: {})."""
    if HEADER_REPLICA not in headers:
        return {}
    return {"replica": headers[HEADER_REPLICA], "reason": headers.get(HEADER_REASON),
            "predicted_hit_tokens": int(headers.get(HEADER_PREDICTED, 0)),
            "best_hit_tokens": int(headers.get(HEADER_BEST, 0))}


def diverted(follow_up: dict, expected: int) -> bool:
    """The router sent the follow-up away from a replica that held its first prompt's ``expected`` tokens (a choice
    of the cost), not where it expected them."""
    route = follow_up.get("route") or {}
    return route.get("best_hit_tokens", 0) >= expected > route.get("predicted_hit_tokens", 0)


def zipf_pick(rng: random.Random, names: list[str], s: float) -> str:
    return rng.choices(names, weights=[1 / (k + 1) ** s for k in range(len(names))])[0]


async def conversations(args, url: str, adapters: list[str], block_size: int) -> list[dict]:
    """``args.conversations`` two-turn conversations over ``args.clients`` clients; one record per conversation."""
    rng = random.Random(args.seed)
    todo = [(i, zipf_pick(rng, adapters, args.zipf)) for i in range(args.conversations)]
    out: list[dict] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while todo:
            i, adapter = todo.pop(0)
            r = random.Random(args.seed * 100_003 + i)
            prompt = [1] + [r.randrange(3, 512) for _ in range(args.prompt_tokens - 1)]  # bos, then no eos (2)
            first = await complete(session, url, adapter, prompt, args.max_tokens, args.timeout_s)
            follow = [r.randrange(3, 512) for _ in range(args.question_tokens)]
            second = await complete(session, url, adapter, prompt + first["tokens"] + follow, args.max_tokens,
                                    args.timeout_s)
            expected = (len(prompt) // block_size) * block_size
            cached = second["status"] == 200 and (second["cached_tokens"] or 0) >= expected
            out.append({"conversation": i, "adapter": adapter, "first": first, "follow_up": second,
                        "expected_cached": expected, "cached": cached,
                        "diverted": not cached and diverted(second, expected)})
            print(f"\r  conversations {len(out)}/{args.conversations}", end="", file=sys.stderr, flush=True)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(args.clients)))
    print(file=sys.stderr)
    return out


async def runtime_loads(args, fleet: ServeProcess, late: dict[str, str], start_after_s: float) -> list[dict]:
    """Load each of ``late`` through the router mid-load, then time a request for it from the call."""
    await asyncio.sleep(start_after_s)
    headers = {"Authorization": f"Bearer {fleet.admin_key}"}
    prompt = [1, 403, 407, 261, 378, 80, 90, 365, 267, 299]
    out = []
    async with aiohttp.ClientSession() as session:
        base = await complete(session, fleet.url, SERVED, prompt, 8, args.timeout_s)
        for name, path in late.items():
            t0 = time.monotonic()
            async with session.post(fleet.url + "/v1/load_lora_adapter", headers=headers,
                                    json={"lora_name": name, "lora_path": path, "base_model_name": SERVED}) as r:
                status, answer = r.status, (await r.text())[:300]
            call_s = time.monotonic() - t0
            rec = await complete(session, fleet.url, name, prompt, 8, args.timeout_s)
            served_s = call_s + rec["ttft_s"] if rec["ttft_s"] is not None else None
            out.append({"adapter": name, "load_status": status, "load_answer": answer, "load_call_s": call_s,
                        "request": rec, "first_token_after_call_s": served_s,
                        "differs_from_base": rec["tokens"] != base["tokens"]})
            await asyncio.sleep(1.0)
    return out


def summarize(convs: list[dict], loads: list[dict], wall_s: float, cpu_s: float) -> dict:
    ok = [c for c in convs if c["first"]["status"] == 200 and c["follow_up"]["status"] == 200]
    cached = sum(c["cached"] for c in convs)
    diverted_ = sum(c["diverted"] for c in convs)
    by_adapter: dict[str, list[int]] = {}
    for c in convs:
        by_adapter.setdefault(c["adapter"], []).append(int(c["cached"]))
    ttfts = sorted(c["first"]["ttft_s"] for c in ok if c["first"]["ttft_s"] is not None)
    follow = sorted(c["follow_up"]["ttft_s"] for c in ok if c["follow_up"]["ttft_s"] is not None)
    served = [x["first_token_after_call_s"] for x in loads]
    requests = 2 * len(convs) + len(loads)
    return {
        "conversations": len(convs), "answered": len(ok), "follow_ups_cached": cached,
        "follow_ups_diverted": diverted_, "follow_ups_lost": len(convs) - cached - diverted_,
        "cached_share": cached / len(convs) if convs else 0.0,
        "cached_share_by_adapter": {a: sum(v) / len(v) for a, v in sorted(by_adapter.items())},
        "first_ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "follow_up_ttft_p50_s": follow[len(follow) // 2] if follow else None,
        "runtime_loads": len(loads), "runtime_load_call_s": [x["load_call_s"] for x in loads],
        "runtime_first_token_after_call_s": served,
        "runtime_adapters_applied": all(x["differs_from_base"] for x in loads),
        "wall_s": wall_s, "cluster_cpu_s": cpu_s, "cpu_s_per_request": cpu_s / requests if requests else None,
        "meets": {"follow_ups_cached": bool(convs) and cached / len(convs) >= CACHED_SHARE_TARGET,
                  "no_follow_up_lost": len(convs) == cached + diverted_,
                  "runtime_load_within_1s": bool(loads) and all(s is not None and s <= RUNTIME_LOAD_TARGET_S
                                                                for s in served)},
    }


def plot(convs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    shares = summary["cached_share_by_adapter"]
    a.bar(list(shares), [100 * v for v in shares.values()], color="#4c72b0")
    a.axhline(100 * CACHED_SHARE_TARGET, color="k", ls="--", lw=1, label="target 95%")
    a.set_ylabel("follow-ups cached (%)")
    a.set_title("follow-ups cached, per adapter")
    a.tick_params(axis="x", rotation=45)
    a.legend(loc="lower right")
    first = [c["first"]["ttft_s"] * 1e3 for c in convs if c["first"]["ttft_s"] is not None]
    follow = [c["follow_up"]["ttft_s"] * 1e3 for c in convs if c["follow_up"]["ttft_s"] is not None]
    b.hist([first, follow], bins=30, label=["first turn", "follow-up"])
    b.set_xlabel("TTFT (ms)")
    b.set_title("time to first token")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kvmesh-lora-fleet-"))
    print(f"writing {args.adapters + args.runtime_loads} adapters under {work}", file=sys.stderr)
    adapters = {f"lora-{i}": str(write_lora_adapter(args.model, work / f"lora-{i}", seed=i))
                for i in range(args.adapters)}
    late = {f"late-{i}": str(write_lora_adapter(args.model, work / f"late-{i}", seed=1000 + i))
            for i in range(args.runtime_loads)}
    fleet = ServeProcess(fleet_config(args, adapters, free_port()), work)
    try:
        print(f"kvmesh serve: {args.replicas} replicas, {args.adapters} adapters (log {fleet.log_path})",
              file=sys.stderr)
        fleet.wait_ready(1 + args.adapters)
        cpu0, t0 = fleet.cpu_seconds(), time.monotonic()

        async def run() -> tuple[list[dict], list[dict]]:
            loads = asyncio.create_task(runtime_loads(args, fleet, late, start_after_s=5.0))
            convs = await conversations(args, fleet.url, list(adapters), BLOCK_SIZE)
            return convs, await loads

        convs, loads = asyncio.run(run())
        summary = summarize(convs, loads, time.monotonic() - t0, fleet.cpu_seconds() - cpu0)
    finally:
        fleet.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "summary": summary, "conversations": convs,
                               "runtime_loads": loads}, indent=1))
    plot(convs, summary, out.with_suffix(".png"))
    s = summary
    print(f"follow-ups cached: {s['follow_ups_cached']}/{s['conversations']} ({100 * s['cached_share']:.1f}%, "
          f"target >= {100 * CACHED_SHARE_TARGET:.0f}%); answered {s['answered']}; not cached: "
          f"{s['follow_ups_diverted']} diverted by the cost, {s['follow_ups_lost']} lost")
    print(f"TTFT p50: first turn {s['first_ttft_p50_s']}, follow-up {s['follow_up_ttft_p50_s']}")
    print("runtime loads: call " + ", ".join(f"{x:.3f}" for x in s["runtime_load_call_s"]) + " s; first token "
          + ", ".join("-" if x is None else f"{x:.3f}" for x in s["runtime_first_token_after_call_s"])
          + f" s after the call (target <= {RUNTIME_LOAD_TARGET_S} s); adapters applied: "
          + str(s["runtime_adapters_applied"]))
    print(f"cluster CPU {s['cluster_cpu_s']:.1f} s over {s['wall_s']:.1f} s wall; wrote {out} and "
          f"{out.with_suffix('.png')}")
    met = all(s["meets"].values()) and s["runtime_adapters_applied"]
    print("acceptance: " + ("met" if met else f"NOT met: {s['meets']}"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
