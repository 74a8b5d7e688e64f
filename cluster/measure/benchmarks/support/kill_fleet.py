"""The processes of ``kvmesh bench replica-kill`` (replica_kill.py): ``kvmesh replica`` processes on fixed ports (a
replica restarted after its kill is the same replica to the router) and ``kvmesh router`` in front of them, each
started until it listens, with its log in a temporary file; the router's view of them (``GET /replicas``).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from kvmesh.cluster.measure.benchmarks.startup import _free_port
from kvmesh.cluster.measure.benchmarks.support.json_http import call

CLI = [sys.executable, "-m", "kvmesh.cluster.cli"]


def _fresh_ports() -> tuple[int, int, int]:
    """HTTP, event and replay ports free now."""
    return _free_port(), _free_port(), _free_port()


class ReplicaProcess:
    """One ``kvmesh replica`` process on fixed ports (so a restarted one is the same replica to the router)."""

    def __init__(self, model: str, name: str, role: str = "both") -> None:
        self.model, self.name, self.role = model, name, role
        self.ports = _fresh_ports()
        self.proc: subprocess.Popen | None = None

    @property
    def spec(self) -> str:
        http, events, replay = self.ports
        return (f"http://127.0.0.1:{http},events=tcp://127.0.0.1:{events},replay=tcp://127.0.0.1:{replay},"
                f"name={self.name},role={self.role}")

    def start(self) -> None:
        http, events, replay = self.ports
        self.proc = subprocess.Popen([*CLI, "replica", "--model", self.model, "--port", str(http), "--event-port",
                                      str(events), "--replay-port", str(replay), "--kv-cache-memory", "8MiB",
                                      "--max-num-seqs", "32", *(["--kv-transfer"] if self.role != "both" else [])],
                                     stdout=subprocess.DEVNULL, stderr=_log(self.name))

    def listening(self, timeout_s: float, attempts: int = 3) -> None:
        """Wait until its HTTP port answers (started already). Its ports are picked free and bound later by the
        process: one taken meanwhile (another listener, or a connection's local port) makes it exit at start; it is
        then started again on fresh ports, before any router knows them."""
        for attempt in range(1, attempts + 1):
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if call("GET", f"http://127.0.0.1:{self.ports[0]}/health", timeout=5.0).status == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.2)
            if self.proc.poll() is None:
                raise RuntimeError(f"replica {self.name} did not answer /health within {timeout_s:.0f}s")
            if attempt < attempts:
                self.ports = _fresh_ports()
                self.start()
        raise RuntimeError(f"replica {self.name} exited at start {attempts} times ({self.proc.returncode}); see its "
                           f"log in {tempfile.gettempdir()}/kvmesh-replica-kill-{self.name}-*.log")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def _log(name: str):
    """A file for a process's log (not a pipe: nobody reads it while the process runs)."""
    return tempfile.NamedTemporaryFile(prefix=f"kvmesh-replica-kill-{name}-", suffix=".log", delete=False)


ADMIN_KEY = secrets.token_urlsafe(16)
"""The router's admin key for this run (``GET /replicas`` is the admin plane)."""


def replica_rows(url: str) -> dict[str, dict]:
    try:
        answer = call("GET", url + "/replicas", timeout=5.0, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        return {r["id"]: r for r in json.loads(answer.body)["replicas"]} if answer.status == 200 else {}
    except (OSError, ValueError):
        return {}


def wait_all_healthy(url: str, procs: list[subprocess.Popen], n: int, timeout_s: float) -> float:
    """Seconds until the router has all ``n`` replicas in rotation; raises after ``timeout_s`` or when one
    of ``procs`` exited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{' '.join(proc.args[:4])}... exited ({proc.returncode}); see its log in "
                                   f"{tempfile.gettempdir()}/kvmesh-replica-kill-*.log")
        rows = replica_rows(url)
        if len(rows) == n and all(r["healthy"] and not r.get("ejected") for r in rows.values()):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise RuntimeError(f"the router did not have all {n} replicas healthy within {timeout_s:.0f}s")


def start_router(router_cmd: str, model: str, replicas: list[ReplicaProcess],
                 timeout_s: float) -> tuple[subprocess.Popen, str]:
    """``router_cmd`` in front of ``replicas``, once it has them all healthy within ``timeout_s``, and its URL. Its
    port, too, is picked free and bound later: a router that exits at start is started again on a fresh one."""
    for attempt in (1, 2, 3):
        url = f"http://127.0.0.1:{_free_port()}"
        argv = [*shlex.split(router_cmd), "--port", url.rsplit(":", 1)[1], "--model", model,
                "--log-level", "error", *(a for r in replicas for a in ("--replica", r.spec))]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_ROUTER_")}
        router = subprocess.Popen(argv, env={**env, "KVMESH_ADMIN_KEY": ADMIN_KEY}, stderr=_log("router"))
        try:
            wait_all_healthy(url, [router, *(r.proc for r in replicas)], len(replicas), timeout_s)
            return router, url
        except RuntimeError:
            if router.poll() is None or attempt == 3:
                router.terminate()
                raise
    raise AssertionError("unreachable")
