"""What moving prompt rendering off the router's event loop costs: thread pool vs shipped vs inline.

    python -m kvmesh.cluster.measure.benchmarks.router_frontend [--requests 300] [--out results/router_frontend.json]

An instant echo replica and three routers (each in its own process, stories260K tokenizer):
``pool`` hands every text prompt to ``PromptRenderer``'s thread pool, ``shipped`` as the code is
(text up to ``_INLINE_CHARS`` on the loop, longer text on the pool), ``inline`` with ``run``
patched to call on the loop (the old behaviour). Requests alternate direct / pool / shipped /
inline, one at a time, for text prompts of ~100 and ~1k tokens (~450 and ~4,500 characters). Reported: p50/p99 wall ms
and each router process's CPU ms per request (what the
hop costs regardless of how busy this shared machine is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.router_http import (
    _cpu_seconds,
    _run_echo,
    timed_post,
    wait_healthy,
)
from kvmesh.cluster.measure.shared_dir import stories_model

STORIES = stories_model()


def _run_router(q, replica_url: str, model: str, variant: str) -> None:
    from kvmesh.replica.openai import renderer
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.router_server import RouterServer

    if variant == "pool":
        renderer._INLINE_CHARS = 0
    elif variant == "inline":
        async def run_inline(self, fn, *args):
            return fn(*args)

        renderer.PromptRenderer.run = run_inline
    server = RouterServer(RouterConfig(port=0, model=model, max_model_len=8192),
                          [ReplicaSpec(replica_url, replica_id="echo")]).start()
    q.put(server.port)
    while True:
        time.sleep(3600)


def _stats(xs: list[float]) -> dict:
    return {"p50_ms": statistics.median(xs), "p99_ms": sorted(xs)[int(len(xs) * 0.99)]}


async def _measure_variants(echo_url: str, routers: dict, prompts: dict, n: int) -> dict:
    """Per prompt kind: direct and per-variant latencies on one keep-alive client, router CPU per request."""
    import aiohttp

    out = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        for _, url in routers.values():
            await wait_healthy(client, url)
        for kind, prompt in prompts.items():
            body = {"prompt": prompt, "max_tokens": 1}
            wall = {"direct": [], **{name: [] for name in routers}}
            cpu0 = {name: _cpu_seconds(p.pid) for name, (p, _) in routers.items()}
            for i in range(n + 20):
                for name, url in (("direct", echo_url), *((k, u) for k, (_, u) in routers.items())):
                    dt = await timed_post(client, url, body)
                    if i >= 20:
                        wall[name].append(dt)
            cpu = {name: (_cpu_seconds(p.pid) - cpu0[name]) * 1e3 / (n + 20) for name, (p, _) in routers.items()}
            out[kind] = {name: {**_stats(xs), **({"router_cpu_ms_per_request": cpu[name]} if name in cpu else {})}
                         for name, xs in wall.items()}
    return out


def measure(model: str, n: int) -> dict:
    from kvmesh.replica.serving.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    words = "Once upon a time there was a little girl named Lily who loved to play in the park. " * 60
    prompts = {f"text_{n}_tokens": tok.decode(tok.encode(words)[1:n + 1]) for n in (100, 1000)}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    echo = ctx.Process(target=_run_echo, args=(q,), daemon=True)
    echo.start()
    echo_url = f"http://127.0.0.1:{q.get(timeout=60)}"
    routers = {}
    for name in ("pool", "shipped", "inline"):
        proc = ctx.Process(target=_run_router, args=(q, echo_url, model, name), daemon=True)
        proc.start()
        routers[name] = (proc, f"http://127.0.0.1:{q.get(timeout=120)}")
    out: dict = {"requests": n, "prompt_chars": {k: len(v) for k, v in prompts.items()}}
    try:
        out.update(asyncio.run(_measure_variants(echo_url, routers, prompts, n)))
    finally:
        for proc in [echo] + [p for p, _ in routers.values()]:
            proc.terminate()
            proc.join(5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--model", default=str(STORIES))
    ap.add_argument("--out", default="results/router_frontend.json")
    args = ap.parse_args()
    result = measure(args.model, args.requests)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
