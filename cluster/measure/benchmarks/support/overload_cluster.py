"""The cluster ``kvmesh bench overload`` starts: real ``kvmesh replica`` processes (stories260K on CPU) and
``kvmesh router`` in front of them, each its own process on loopback and free ports, as an operator runs them.

Shapes: N replicas (role both), or a P/D split (one prefill replica and one decode replica with KV transfer,
the router splitting prompts of at least ``pd_min_uncached_tokens``); the router with ``--workers W``. Extra
flags reach every replica (``replica_args``, e.g. a scheduling policy) and the router (``router_args``, e.g. an
admission keys file). Logs go to files named in errors; ``stop()`` ends every process it started.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.json_http import call
from kvmesh.cluster.measure.benchmarks.support.peer_load import free_port, tree_cpu_seconds

CLI = [sys.executable, "-m", "kvmesh.cluster.cli"]


@dataclass(slots=True)
class ClusterShape:
    model: str
    replicas: int = 1
    workers: int = 1
    pd: bool = False
    """One prefill and one decode replica (``replicas`` is ignored)."""
    max_num_seqs: int = 4
    kv_cache_memory: str = "32MiB"
    pd_min_uncached_tokens: int = 16
    replica_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    cli: list[str] = field(default_factory=lambda: list(CLI))
    """The command that starts ``kvmesh`` (another build's, to compare: ``env PYTHONPATH=... python -m ...``)."""

    @property
    def roles(self) -> list[str]:
        return ["prefill", "decode"] if self.pd else ["both"] * self.replicas

    @property
    def label(self) -> str:
        """A short name of the shape for result files: '' for 1 replica and 1 worker, else e.g. '_2replicas'."""
        parts = (["pd"] if self.pd else [f"{self.replicas}replicas"] if self.replicas != 1 else [])
        return "".join(f"_{p}" for p in parts + ([f"workers{self.workers}"] if self.workers != 1 else []))


class Cluster:
    def __init__(self, shape: ClusterShape) -> None:
        self.shape = shape
        self.admin_key = secrets.token_urlsafe(16)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        self.url = ""

    def _log(self, name: str):
        """A file for a process's log (not a pipe: nobody reads it while the process runs)."""
        path = Path(tempfile.gettempdir(), f"kvmesh-overload-{name}-{os.getpid()}.log")
        self.logs.append(str(path))
        return path.open("w")

    def start(self, timeout_s: float = 180.0) -> str:
        """Start every process and wait until the router has every replica healthy; the router's URL."""
        s, specs = self.shape, []
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVMESH_ROUTER_", "KVMESH_API_KEY"))}
        for i, role in enumerate(s.roles):
            http, events, replay = free_port(), free_port(), free_port()
            cmd = [*s.cli, "replica", "--model", s.model, "--host", "127.0.0.1", "--port", str(http),
                   "--event-port", str(events), "--replay-port", str(replay), "--kv-cache-memory", s.kv_cache_memory,
                   "--max-num-seqs", str(s.max_num_seqs), *(["--kv-transfer"] if s.pd else []), *s.replica_args]
            with self._log(f"r{i}") as log:
                self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env))
            specs.append(f"http://127.0.0.1:{http},events=tcp://127.0.0.1:{events},replay=tcp://127.0.0.1:{replay},"
                         f"name=r{i},role={role}")
        port = free_port()
        cmd = [*s.cli, "router", "--model", s.model, "--host", "127.0.0.1", "--port", str(port), "--workers",
               str(s.workers), "--log-level", "warning",
               *(["--pd-min-uncached-tokens", str(s.pd_min_uncached_tokens)] if s.pd else []), *s.router_args,
               *[a for spec in specs for a in ("--replica", spec)]]
        with self._log("router") as log:
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                               env={**env, "KVMESH_ADMIN_KEY": self.admin_key}))
        self.url = f"http://127.0.0.1:{port}"
        self._wait_healthy(len(specs), timeout_s)
        return self.url

    def replica_rows(self) -> list[dict]:
        """The router's ``GET /replicas`` rows ([] when it does not answer)."""
        try:
            a = call("GET", self.url + "/replicas", timeout=5.0, headers={"Authorization": f"Bearer {self.admin_key}"})
            return json.loads(a.body)["replicas"] if a.status == 200 else []
        except (OSError, ValueError, KeyError):
            return []

    def _wait_healthy(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{' '.join(p.args[:6])}... exited ({p.returncode}); "
                                       f"logs: {', '.join(self.logs)}")
            rows = self.replica_rows()
            if len(rows) == n and all(r["healthy"] and not r.get("ejected") for r in rows):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the router did not have {n} healthy replicas within {timeout_s:.0f} s; "
                           f"logs: {', '.join(self.logs)}")

    def in_flight(self) -> int | None:
        rows = self.replica_rows()
        return sum(r.get("in_flight", 0) for r in rows) if rows else None

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of every process started, children included."""
        return sum(tree_cpu_seconds(p.pid) for p in self.procs if p.poll() is None)

    def metrics(self) -> str:
        try:
            return call("GET", self.url + "/metrics", timeout=5.0).text
        except OSError:
            return ""

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs.clear()


def wait_idle(cluster: Cluster | None, timeout_s: float, fallback_s: float = 2.0) -> float:
    """Wait until the router counts nothing in flight (bounded); without a cluster of ours, ``fallback_s``. The
    seconds waited."""
    t0 = time.monotonic()
    if cluster is None:
        time.sleep(fallback_s)
        return fallback_s
    while time.monotonic() - t0 < timeout_s:
        n = cluster.in_flight()
        if n == 0 or n is None:
            break
        time.sleep(0.25)
    return time.monotonic() - t0


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (any labels) in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total
