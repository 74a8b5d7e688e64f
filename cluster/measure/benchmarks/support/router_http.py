"""Added latency of the router: a prompt through the router vs straight to the replica.

The replica is an instant echo server (no model: the router's overhead is the whole difference),
in its own process; the router runs in another, so the client does not share their GIL.
Requests alternate between the two paths, one at a time (low load).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time

from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' annotations here
from fastapi.responses import Response

ECHO_BODY = (b'{"id":"cmpl-echo","object":"text_completion","created":0,"model":"echo","choices":'
             b'[{"index":0,"text":"!","finish_reason":"length"}],"usage":{"prompt_tokens":1,'
             b'"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}')


def _run_echo(q) -> None:
    import asyncio

    import uvicorn

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request):
        await request.body()
        return Response(ECHO_BODY, media_type="application/json")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/load")
    async def load():
        return {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage": 0.0,
                "num_waiting_prefill_tokens": 0}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))

    async def main():
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        q.put(server.servers[0].sockets[0].getsockname()[1])
        await task

    asyncio.run(main())


def _run_router(q, replica_url: str, model: str | None) -> None:
    from kvmesh.router.config import ReplicaSpec, RouterConfig
    from kvmesh.router.control.router_server import RouterServer

    cfg = RouterConfig(port=0, model=model, max_model_len=8192 if model else None)
    server = RouterServer(cfg, [ReplicaSpec(replica_url, replica_id="echo")]).start()
    q.put(server.port)
    while True:
        time.sleep(3600)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; 0 elsewhere)."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


async def wait_healthy(session, url: str, tries: int = 100) -> None:
    """Until ``url``/health answers 200 (0.1 s apart)."""
    import aiohttp

    for _ in range(tries):
        try:
            async with session.get(url + "/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy")


async def timed_post(session, url: str, body: dict) -> float:
    """Milliseconds for one ``POST url/v1/completions``, answer read in full; raises unless 200."""
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as r:
        raw = await r.read()
    dt = (time.perf_counter() - t0) * 1e3
    if r.status != 200:
        raise RuntimeError(f"{url}: {r.status} {raw[:200]!r}")
    return dt


async def _direct_and_routed(echo_url: str, router_url: str, body: dict, n: int, pids: dict) -> tuple:
    """Alternating direct and routed requests on one keep-alive client; CPU ms of each process."""
    import aiohttp

    direct, routed = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        await wait_healthy(client, router_url)  # both up, connections warm
        cpu0 = {k: _cpu_seconds(pid) for k, pid in pids.items()}
        for i in range(n + 20):
            for url, out in ((echo_url, direct), (router_url, routed)):
                dt = await timed_post(client, url, body)
                if i >= 20:
                    out.append(dt)
        cpu = {k: (_cpu_seconds(pid) - cpu0[k]) * 1e3 for k, pid in pids.items()}
    return direct, routed, cpu


def measure_added_latency(tokenizer_factory, text_factory, n: int) -> dict:
    tok = tokenizer_factory()
    model = str(tok.name) if tok is not None else None
    prompt = text_factory(tok, 1000) if tok is not None else list(range(1000))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    echo = ctx.Process(target=_run_echo, args=(q,), daemon=True)
    echo.start()
    echo_url = f"http://127.0.0.1:{q.get(timeout=60)}"
    router = ctx.Process(target=_run_router, args=(q, echo_url, model), daemon=True)
    router.start()
    try:
        router_url = f"http://127.0.0.1:{q.get(timeout=120)}"
        body = {"prompt": prompt, "max_tokens": 1}
        direct, routed, cpu = asyncio.run(_direct_and_routed(echo_url, router_url, body, n,
                                                             {"router": router.pid, "echo": echo.pid}))
        d50, r50 = statistics.median(direct), statistics.median(routed)
        p99 = lambda xs: sorted(xs)[int(len(xs) * 0.99)]  # noqa: E731
        return {"requests": n, "prompt": "text" if tok is not None else "token ids",
                "prompt_tokens": len(tok.encode(prompt)) if tok is not None else len(prompt),
                "direct_p50_ms": d50, "router_p50_ms": r50, "added_p50_ms": r50 - d50,
                "direct_p99_ms": p99(direct), "router_p99_ms": p99(routed), "target_added_p50_ms": 1.0,
                # CPU the router process spent per routed request (tokenize, route, proxy, HTTP both
                # ways): what the hop costs regardless of how busy the machine is.
                "router_cpu_ms_per_request": cpu["router"] / (n + 20),
                "echo_cpu_ms_per_request": cpu["echo"] / (2 * (n + 20))}
    finally:
        for p in (router, echo):
            p.terminate()
            p.join(5)
