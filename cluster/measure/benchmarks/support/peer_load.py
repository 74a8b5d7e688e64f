"""Process and load plumbing of ``kvmesh bench router-peers``: pinning, /proc CPU, wrk, one-client latency."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes, wait_http  # noqa: F401 (drivers use them from here)

WRK_SCRIPT = r"""
local reqs = {}
local path = os.getenv("KVMESH_WRK_PATH")
for line in io.lines(os.getenv("KVMESH_WRK_BODIES")) do
  reqs[#reqs + 1] = wrk.format("POST", path, {["Content-Type"] = "application/json"}, line)
end
local i = 0
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('\nKVMESH {"requests": %d, "duration_us": %d, "socket_errors": %d, "status_errors": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status))
end
"""




def pinned(cmd: list[str], cpu: int | None) -> list[str]:
    """``cmd`` run on one CPU core (taskset), or as is when there is no taskset or no core given."""
    if cpu is None or shutil.which("taskset") is None:
        return cmd
    return ["taskset", "-c", str(cpu), *cmd]


def start_stub_replicas(procs: list, n: int = 2) -> list[str]:
    """``n`` instant stub replicas (fake_replica.py) on core 1, their processes appended to ``procs``
    (the caller stops them): their URLs."""
    urls = []
    for _ in range(n):
        p = subprocess.Popen(pinned([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica"],
                                    1),
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        urls.append(f"http://127.0.0.1:{json.loads(p.stdout.readline())['port']}")
    return urls




def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and all its live descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        if p in stats:
            total += int(stats[p][11]) + int(stats[p][12])
        stack += children.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")




def run_wrk(url: str, path: str, bodies: list[str], connections: int, duration_s: float, cpu: int | None) -> dict:
    """A closed loop of ``connections`` keep-alive clients (wrk, one thread) cycling through ``bodies``."""
    with tempfile.TemporaryDirectory() as tmp:
        script, body_file = Path(tmp, "bodies.lua"), Path(tmp, "bodies.jsonl")
        script.write_text(WRK_SCRIPT)
        body_file.write_text("\n".join(bodies) + "\n")
        env = {**os.environ, "KVMESH_WRK_PATH": path, "KVMESH_WRK_BODIES": str(body_file)}
        cmd = pinned(["wrk", "-t1", f"-c{connections}", f"-d{max(int(round(duration_s)), 1)}s", "--timeout", "10s",
                      "-s", str(script), url], cpu)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=duration_s + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("KVMESH ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {out.stderr.strip() or out.stdout.strip()}")
    res = json.loads(line[len("KVMESH "):])
    res["duration_s"] = res.pop("duration_us") / 1e6
    return res


class KeepAliveClient:
    """One HTTP/1.1 keep-alive connection posting JSON bodies, reconnecting when the server closes it."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)

    def post(self, path: str, body: str) -> tuple[int, float]:
        t0 = time.perf_counter()
        try:
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            t0 = time.perf_counter()
            self.conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        resp.read()
        return resp.status, (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.conn.close()


def added_latency(router_url: str, direct_url: str, path: str, bodies: list[str], n: int) -> dict:
    """One client, requests alternating between the router and the replica directly; ms added by the hop."""
    via, direct = KeepAliveClient(router_url), KeepAliveClient(direct_url)
    routed_ms, direct_ms, errors = [], [], 0
    try:
        for i in range(n):
            body = bodies[i % len(bodies)]
            status, ms = via.post(path, body)
            errors += status != 200
            routed_ms.append(ms)
            direct_ms.append(direct.post(path, body)[1])
    finally:
        via.close()
        direct.close()
    p99 = lambda xs: sorted(xs)[min(int(len(xs) * 0.99), len(xs) - 1)]  # noqa: E731
    return {"requests": n, "errors": errors, "router_p50_ms": statistics.median(routed_ms),
            "direct_p50_ms": statistics.median(direct_ms),
            "added_p50_ms": statistics.median(routed_ms) - statistics.median(direct_ms),
            "added_p99_ms": p99(routed_ms) - p99(direct_ms)}
