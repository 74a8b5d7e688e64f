"""A sick replica next to a healthy one behind ``kvmesh router`` with its default settings: what clients pay.

    kvmesh bench sick-replica [--model ../shared/models/stories260K/hf] [--concurrency 8] [--client-timeout 120]
                              [--router-cmd "python -m kvmesh.cluster.cli router"] [--out results/sick_replica.json]

Two fake replicas (cluster/measure/benchmarks/support/fake_replica.py), each its own process: ``healthy`` answers at
once; ``sick`` answers ``/health``, ``/load`` and ``/server_info`` like a real one but

- ``never-answers``: never answers a completion. Two waves of ``--concurrency`` concurrent completions, the
  second right after the first: each request's status and latency (acceptance: wave 1 all 200 within 45 s
  each, wave 2 all within 5 s -- the sick replica out of rotation).
- ``stalls``: every stream stops after two chunks, its connection left open. One wave of concurrent
  streams: each stream's time to its end, and how it ended (``[DONE]`` without error, an error event, or not
  at all before the client gave up).

Each scenario starts its own router and replicas (``--router-cmd`` runs another build's router, to compare
before and after). No flag sets a router option: what is measured is the default. Results go to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.startup import _free_port
from kvmesh.cluster.measure.benchmarks.support.json_http import call
from kvmesh.cluster.measure.shared_dir import stories_model

FAKE = [sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica", "--port", "0"]


def start_fake(name: str, words: bool) -> tuple[subprocess.Popen, str]:
    """A fake replica answering its name (or, with ``words``, max_tokens words): its process and URL."""
    proc = subprocess.Popen([*FAKE, "--name", name, *(["--answer-max-tokens"] * words)], stdout=subprocess.PIPE,
                            text=True)
    return proc, json.loads(proc.stdout.readline())["url"]


def start_router(args, urls: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    argv = [*shlex.split(args.router_cmd), "--port", str(port), "--log-level", "warning"]
    argv += [a for name, url in urls.items() for a in ("--replica", f"{url},name={name}")]
    if args.model:
        argv += ["--model", args.model]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_ROUTER_")} | {"PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(argv, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            answer = call("GET", url + "/health", timeout=5.0)  # /replicas is the admin plane's
            health = json.loads(answer.body) if answer.status == 200 else {}
            if health.get("replicas") and len(health["healthy_replicas"]) == health["replicas"]:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"the router exited ({proc.returncode})")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the router did not see both replicas healthy within 60 s")


def complete(url: str, i: int, timeout: float) -> dict:
    """One non-streamed completion: status, latency, which replica answered."""
    t0 = time.monotonic()
    try:
        answer = call("POST", url + "/v1/completions", {"prompt": f"Once upon a time {i}", "max_tokens": 2}, timeout)
        status, raw = answer.status, answer.body
        text = json.loads(raw)["choices"][0]["text"] if status == 200 else raw[:200].decode(errors="replace")
    except OSError as e:  # the client gave up
        status, text = None, f"{type(e).__name__}: {e}"
    return {"status": status, "latency_s": round(time.monotonic() - t0, 2), "answer": text}


def stream(url: str, i: int, timeout: float) -> dict:
    """One streamed completion: time to its end and how it ended."""
    t0 = time.monotonic()
    out = {"ended": "no end", "chunks": 0, "error": None}
    body = json.dumps({"prompt": f"Once upon a time {i}", "max_tokens": 6, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    out["ended"] = "error event" if out["error"] else "[DONE]"
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out["error"] = chunk["error"]["message"][:160]
                else:
                    out["chunks"] += 1
    except (OSError, ValueError) as e:
        out["ended"] = f"client gave up: {type(e).__name__}"
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def wave(fn, url: str, start: int, args) -> list[dict]:
    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(lambda i: fn(url, start + i, args.client_timeout), range(args.concurrency)))


def summary(results: list[dict], key: str) -> dict:
    times = [r[key] for r in results]
    return {"max_s": max(times), "p50_s": sorted(times)[len(times) // 2], "all_s": times}


def scenario(args, name: str, faults: dict, run) -> dict:
    fakes = {n: start_fake(n, words="stall_after" in faults) for n in ("healthy", "sick")}
    router = None
    try:
        router, url = start_router(args, {n: u for n, (_, u) in fakes.items()})
        call("POST", fakes["sick"][1] + "/fake/config", faults, timeout=5.0)
        print(f"{name}: router {url}, sick replica {faults}", flush=True)
        return run(url)
    finally:
        for proc in [router, *(p for p, _ in fakes.values())]:
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def never_answers(args) -> dict:
    def run(url: str) -> dict:
        out = {}
        for n in (1, 2):
            t0 = time.monotonic()
            results = wave(complete, url, 100 * n, args)
            ok = sum(r["status"] == 200 for r in results)
            out[f"wave{n}"] = {"ok": ok, "requests": len(results), **summary(results, "latency_s"),
                               "answered_by": sorted({r["answer"] for r in results if r["status"] == 200}),
                               "failures": [r for r in results if r["status"] != 200][:3]}
            print(f"  wave {n}: {ok}/{len(results)} answered 200; latency max {out[f'wave{n}']['max_s']} s "
                  f"(wall {time.monotonic() - t0:.1f} s)", flush=True)
        return out

    return scenario(args, "never-answers", {"delay": 3600}, run)


def stalls(args) -> dict:
    def run(url: str) -> dict:
        results = wave(stream, url, 300, args)
        ends = {e: sum(r["ended"] == e for r in results) for e in sorted({r["ended"] for r in results})}
        print(f"  streams: {ends}; time to end max {max(r['seconds'] for r in results)} s", flush=True)
        return {"ended": ends, **summary(results, "seconds"),
                "errors": sorted({r["error"] for r in results if r["error"]})[:3]}

    return scenario(args, "stalls", {"stall_after": 2}, run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvmesh bench sick-replica", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default_model = stories_model()
    ap.add_argument("--model", default=str(default_model) if default_model.is_dir() else None,
                    help="the router's tokenizer (default: the shared stories260K if present; none: load-only routing)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests per wave (default: %(default)s)")
    ap.add_argument("--client-timeout", type=float, default=120.0,
                    help="seconds a client waits before giving up (default: %(default)s)")
    ap.add_argument("--router-cmd", default=f"{sys.executable} -m kvmesh.cluster.cli router",
                    help="command that starts the router (another build's, to compare)")
    ap.add_argument("--scenarios", default="never-answers,stalls", help="comma-separated: never-answers, stalls")
    ap.add_argument("--out", default="results/sick_replica.json")
    args = ap.parse_args(argv)
    runs = {"never-answers": never_answers, "stalls": stalls}
    unknown = [s for s in args.scenarios.split(",") if s not in runs]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r}; choose from {', '.join(runs)}")
    results = {"router_cmd": args.router_cmd, "concurrency": args.concurrency, "client_timeout_s": args.client_timeout}
    for name in args.scenarios.split(","):
        results[name] = runs[name](args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
