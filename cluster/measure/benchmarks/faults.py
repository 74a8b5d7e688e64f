"""Kill-under-load benchmark: replicas killed while streams run; what clients see, and how long capacity is down.

    kvmesh bench faults --model ../shared/models/stories260K/hf [--replicas 2] [--concurrency 8]
                        [--duration 60] [--kills 3] [--first-kill 10] [--kill-every 15] [--migration-limit N]
                        [--out results/faults.json]

Starts ``kvmesh serve`` as a user would (embedded Ray on CPU), learns each prompt's greedy answer from the
idle cluster, then keeps ``--concurrency`` streaming completions in flight for ``--duration`` seconds
while it SIGKILLs one replica actor process (``ray::ReplicaActor``) ``--kills`` times. Reported:
requests failed before their first byte (an HTTP error or no answer) and after it (an error event, no
``[DONE]``, a broken connection), streams whose text differs from the idle cluster's greedy answer,
the router's stream migrations and retries, and per kill the time until the router saw it and until
every replica was healthy again (full capacity). Results go to a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.startup import _cmdline, _free_port, _tree
from kvmesh.cluster.measure.benchmarks.support.json_http import get

PROMPTS = [f"Once upon a time, {who} went to the {where} and" for who in ("Lily", "Tom", "a little dog", "Ben")
           for where in ("park", "sea", "shop", "forest")]


def _metric(text: str, name: str) -> float:
    """Sum of every sample of ``name`` in a Prometheus text page."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def start_serve(args: argparse.Namespace, port: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--port", str(port),
            "--num-replicas", str(args.replicas), "--model", args.model]
    if args.migration_limit is not None:
        argv += ["--migration-limit", str(args.migration_limit)]
    env = {k: v for k, v in os.environ.items() if k != "KVMESH_API_KEY"} | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + args.timeout
    for line in proc.stdout:
        if line.startswith("kvmesh"):
            print(f"  {line.strip()[:120]}", flush=True)
        if line.startswith("kvmesh is ready"):
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"kvmesh serve did not get ready within {args.timeout}s")


async def stream_once(client, body: dict) -> dict:
    """One streamed completion: where it failed (if it did) and its text."""
    out = {"ok": False, "first_byte": False, "text": "", "error": None}
    try:
        async with client.post("/v1/completions", json=body) as r:
            if r.status != 200:
                out["error"] = f"HTTP {r.status}"
                return out
            async for raw_line in r.content:
                out["first_byte"] = True
                line = raw_line.decode().rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out["ok"] = out["error"] is None
                    return out
                chunk = json.loads(data)
                if "error" in chunk:
                    out["error"] = chunk["error"]["message"][:200]
                elif chunk.get("choices"):
                    out["text"] += chunk["choices"][0]["text"]
            out["error"] = out["error"] or "stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001 - a failed request is a result here
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    return out


async def run_load(args, url: str, expected: dict[str, str], stop_at: float) -> list[dict]:
    from kvmesh.cluster.measure.loadgen.client import open_session

    results: list[dict] = []

    async def worker(i: int) -> None:
        n = i
        async with open_session(url, total_s=120) as client:
            while time.monotonic() < stop_at:
                prompt = PROMPTS[n % len(PROMPTS)]
                n += args.concurrency
                res = await stream_once(client, body(args, prompt))
                res["exact"] = res["ok"] and res["text"] == expected[prompt]
                results.append(res)

    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    return results


async def greedy_answers(args, url: str) -> dict[str, str]:
    """Each prompt's answer from the idle cluster (the reference a migrated stream must match)."""
    from kvmesh.cluster.measure.loadgen.client import open_session

    expected = {}
    async with open_session(url, total_s=120) as client:
        for prompt in PROMPTS:
            res = await stream_once(client, body(args, prompt))
            if not res["ok"]:
                raise RuntimeError(f"the idle cluster failed a request: {res['error']}")
            expected[prompt] = res["text"]
    return expected


def body(args, prompt: str) -> dict:
    return {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}


def healthy(url: str) -> tuple[float, str]:
    try:
        answer = get(url + "/metrics", timeout=5)
    except OSError:
        return -1.0, ""
    if answer.status != 200:
        return -1.0, ""
    return _metric(answer.text, "kvmesh_router_replica_healthy"), answer.text


def kill_and_watch(args, proc: subprocess.Popen, url: str, index: int) -> dict:
    """SIGKILL one replica actor; time until the router sees it and until all replicas are healthy."""
    actors = sorted(p for p in _tree(proc.pid) if _cmdline(p).startswith("ray::ReplicaActor"))
    if not actors:
        return {"kill": index, "error": "no replica actor process found"}
    t0 = time.monotonic()
    os.kill(actors[0], signal.SIGKILL)
    seen = restored = None
    while time.monotonic() - t0 < args.recover_timeout:
        n, _ = healthy(url)
        now = time.monotonic() - t0
        if seen is None and 0 <= n < args.replicas:
            seen = now
        if seen is not None and n >= args.replicas:
            restored = now
            break
        time.sleep(0.1)
    print(f"  kill {index}: pid {actors[0]}; router saw it after {seen}s, full capacity after {restored}s", flush=True)
    return {"kill": index, "pid": actors[0], "router_saw_s": _round(seen), "full_capacity_s": _round(restored)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


async def scenario(args, proc: subprocess.Popen, url: str, expected: dict[str, str]) -> tuple[list, list]:
    t0 = time.monotonic()
    load = asyncio.ensure_future(run_load(args, url, expected, t0 + args.duration))
    kills = []
    for k in range(args.kills):
        delay = t0 + args.first_kill + k * args.kill_every - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.monotonic() > t0 + args.duration:
            break
        kills.append(await asyncio.to_thread(kill_and_watch, args, proc, url, k + 1))
    return await load, kills


def summarize(results: list[dict], kills: list[dict], page: str, wall_s: float, cpu_s: float) -> dict:
    before = [r for r in results if not r["ok"] and not r["first_byte"]]
    after = [r for r in results if not r["ok"] and r["first_byte"]]
    restored = [k["full_capacity_s"] for k in kills if k.get("full_capacity_s") is not None]
    return {
        "requests": len(results),
        "completed": sum(r["ok"] for r in results),
        "failed_before_first_byte": len(before),
        "failed_after_first_byte": len(after),
        "inexact_text": sum(r["ok"] and not r["exact"] for r in results),
        "stream_migrations": _metric(page, "kvmesh_router_stream_migrations_total"),
        "retries_before_first_byte": _metric(page, "kvmesh_router_retries_total"),
        "kills": kills,
        "full_capacity_s_max": max(restored) if restored else None,
        "kills_not_restored": sum(k.get("full_capacity_s") is None for k in kills),
        "failure_examples": sorted({r["error"] for r in before + after})[:5],
        "wall_s": round(wall_s, 1),
        "requests_per_s": round(len(results) / wall_s, 2),
        "router_driver_cpu_ms_per_request": round(1000 * cpu_s / max(1, len(results)), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded", help="model of the replicas (stories260K's hf directory)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="streams kept in flight")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (bounded)")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--first-kill", type=float, default=10.0, help="seconds into the load")
    parser.add_argument("--kill-every", type=float, default=15.0)
    parser.add_argument("--recover-timeout", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="for serve to get ready")
    parser.add_argument("--migration-limit", type=int, default=None,
                        help="the router's migration_limit (default: serve's); 0 shows what streams see without")
    parser.add_argument("--out", default="results/faults.json")
    args = parser.parse_args(argv)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_serve(args, port)
    try:
        expected = asyncio.run(greedy_answers(args, url))
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        results, kills = asyncio.run(scenario(args, proc, url, expected))
        wall, cpu = time.monotonic() - t0, _cpu_s(proc.pid) - cpu0
        _, page = healthy(url)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    summary = summarize(results, kills, page, wall, cpu)
    result = {"benchmark": "faults",
              "command": "kvmesh bench faults " + " ".join(argv if argv is not None else sys.argv[1:]),
              "config": {k: v for k, v in vars(args).items() if k != "out"},
              "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": round(os.getloadavg()[0], 2)},
              **summary}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "kills"}, indent=2))
    print(f"wrote {out}")
    return 0 if summary["failed_before_first_byte"] + summary["failed_after_first_byte"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
