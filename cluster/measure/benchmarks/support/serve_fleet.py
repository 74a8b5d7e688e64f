"""``kvmesh serve --config FILE`` as a process of its own, for live benchmarks: its router's URL, its admin key once
ready, its log, its CPU, and a Ctrl-C to stop it (replicas, router and its own Ray with it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peer_load import tree_cpu_seconds


class ServeProcess:
    """``kvmesh serve --config FILE`` as a process, and its router's URL and admin key."""

    def __init__(self, config: dict, work: Path) -> None:
        self.work, self.port = work, config["router"]["port"]
        self.url = f"http://127.0.0.1:{self.port}"
        (work / "fleet.json").write_text(json.dumps(config))  # YAML is a superset of JSON
        self.log_path = work / "serve.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KVMESH_API_KEY", "KVMESH_ADMIN_KEY"))}
        env["KVMESH_CLUSTERS_DIR"] = str(work / "clusters")
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--config",
                                         str(work / "fleet.json")], stdout=log, stderr=subprocess.STDOUT, env=env)
        self.admin_key = ""

    def wait_ready(self, n_models: int, timeout_s: float = 300.0) -> None:
        """Until the router lists the base model and ``n_models - 1`` adapters and the admin key is written."""
        import urllib.request

        record = self.work / "clusters" / f"127.0.0.1_{self.port}.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvmesh serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    listed = len(json.loads(r.read())["data"])
                if listed >= n_models and record.exists():
                    self.admin_key = json.loads(record.read_text())["admin_key"]
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"kvmesh serve was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # Ctrl-C: serve stops its replicas, router and Ray
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
