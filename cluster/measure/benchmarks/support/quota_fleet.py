"""The processes ``kvmesh bench fleet_quota`` runs: emulated replicas (one ``kvmesh replica --emulate`` process, real
tokens through the router's whole path) and N ``kvmesh router`` processes in front of them, each its own process on
loopback, sharing one state directory (their tenants' token totals: quota.sqlite3) and one keys file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.json_http import call
from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes, wait_http
from kvmesh.cluster.measure.shared_dir import stories_model

READY_TIMEOUT_S = 300.0
LIGHT_KEY = "sk-light-tenant-0002"


def heavy_key(run: int) -> str:
    """The key of run ``run``'s heavy tenant (``heavy<run>``: each run's bucket its own, starting full)."""
    return f"sk-heavy-tenant-{run:04d}"


def kvmesh(*args: str) -> list[str]:
    return ["nice", "-n", "15", sys.executable, "-m", "kvmesh.cluster.cli", *args]


def write_keys(work: Path, runs: list[int], tokens_per_s: float, burst_tokens: float) -> Path:
    """The routers' keys file: a heavy tenant per run at ``tokens_per_s``, the light one unlimited."""
    path = work / "keys.json"
    heavy = [{"key": heavy_key(n), "tenant": f"heavy{n}", "tokens_per_s": tokens_per_s, "burst_tokens": burst_tokens}
             for n in runs]
    path.write_text(json.dumps({"keys": [*heavy, {"key": LIGHT_KEY, "tenant": "light"}]}))
    return path


class QuotaFleet:
    """Replicas and routers started once (a run uses the first N routers); ``stop`` ends everything."""

    def __init__(self, work: Path, replicas: int) -> None:
        self.work, self.replicas = work, replicas
        self.model = str(stories_model())
        self.replica_procs: list[subprocess.Popen] = []
        self.router_procs: list[subprocess.Popen] = []
        self.specs: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KVMESH_ROUTER_", "KVMESH_API_KEY"))}

    def start_replicas(self) -> None:
        log = (self.work / "replicas.log").open("w")
        proc = subprocess.Popen(kvmesh("replica", "--model", self.model, "--emulate", "h100-8b", "--num-replicas",
                                       str(self.replicas), "--host", "127.0.0.1", "--port", "0", "--event-port", "0",
                                       "--replay-port", "0", "--kv-cache-memory", "4GiB", "--max-model-len", "4096"),
                                stdout=subprocess.PIPE, stderr=log, text=True, env=self.env)
        self.replica_procs.append(proc)
        assert proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self.specs) < self.replicas:
            line = proc.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"the emulated replicas did not start; their log: {self.work / 'replicas.log'}")
            end = json.loads(line)
            self.specs.append(f"{end['http_url']},events={end['events_endpoint']},replay={end['replay_endpoint']}")

    def start_routers(self, n: int, keys: Path, state: Path, extra: list[str] | None = None) -> list[str]:
        """``n`` routers sharing ``state`` (their quota database); their URLs once each serves a request."""
        state.mkdir(parents=True, exist_ok=True)
        urls = []
        for i in range(n):
            port = free_port()
            log = (self.work / f"router{i}.log").open("w")
            self.router_procs.append(subprocess.Popen(
                kvmesh("router", "--model", self.model, "--host", "127.0.0.1", "--port", str(port), "--log-level",
                       "warning", "--admission-keys-file", str(keys), *(extra or []),
                       *[a for s in self.specs for a in ("--replica", s)]),
                stdout=log, stderr=subprocess.STDOUT, env={**self.env, "KVMESH_STATE_DIR": str(state)}))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, self.router_procs[-n:], strict=True):
            wait_http(url, timeout_s=READY_TIMEOUT_S, proc=proc)
            self._wait_serving(url)
        return urls

    def _wait_serving(self, url: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        body = {"model": self.model, "prompt": "ready", "max_tokens": 1}
        while time.monotonic() < deadline:
            try:
                if call("POST", url + "/v1/completions", body, timeout=10.0,
                        headers={"Authorization": f"Bearer {LIGHT_KEY}"}).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"router {url} served no request within {READY_TIMEOUT_S:.0f} s; logs in {self.work}")

    def stop_routers(self) -> None:
        stop_processes(self.router_procs, 20.0)
        self.router_procs.clear()

    def stop(self) -> None:
        self.stop_routers()
        stop_processes(self.replica_procs, 20.0)
        self.replica_procs.clear()
