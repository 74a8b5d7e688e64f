"""A two-node Ray cluster on one machine: a head and a worker in two network namespaces.

    ┌─ netns kvh<id> ──────────────┐  veth pair   ┌─ netns kvw<id> ──────────────┐
    │ ray head (GCS, raylet)       │◀────────────▶│ ray worker node (raylet)      │
    │ 10.213.<n>.1/24   + driver   │              │ 10.213.<n>.2/24               │
    └──────────────────────────────┘              └───────────────────────────────┘

The addresses exist only inside the namespaces. Each ``ray start --block`` is a child of the
test, so closing terminates exactly those processes (never ``ray stop``, which would also kill
other Ray instances on the machine), then kills by pid whatever is left in the namespaces,
deletes them (the veth pair goes with them) and the Ray temp dir.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY_BIN = Path(sys.executable).parent / "ray"
# Same settings for both nodes and the driver: no usage stats; token auth off (whether Ray turns it on
# depends on a ~/.ray/auth_token left by earlier local ray.init() calls, so pin it).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def netns_unavailable_reason() -> str | None:
    """None when network namespaces can be made here; else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs the `ip` tool (apt-get install iproute2)"
    probe = f"kvprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class TwoNodeCluster:
    """Head + worker Ray nodes in two namespaces; use as a context manager."""

    def __init__(self, cpus_per_node: int = 2, subnet: int | None = None, attempts: int = 2) -> None:
        tag = os.getpid() % 100000
        self.head_ns, self.worker_ns = f"kvh{tag}", f"kvw{tag}"
        n = subnet if subnet is not None else 16 + tag % 200
        self.head_ip, self.worker_ip = f"10.213.{n}.1", f"10.213.{n}.2"
        self.address = f"{self.head_ip}:6379"
        self.cpus_per_node = cpus_per_node
        self.attempts = attempts
        self.temp_dir = tempfile.mkdtemp(prefix="kvnetns-")
        self.procs: list[subprocess.Popen] = []

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> TwoNodeCluster:
        # Ray gives a raylet a fixed 30 s to register; on a loaded 2-core machine that can fail once.
        for attempt in range(1, self.attempts + 1):
            try:
                self._make_network()
                self._start_node(self.head_ns, ["--head", "--port", "6379", "--node-ip-address", self.head_ip,
                                                "--include-dashboard=false", "--temp-dir", self.temp_dir])
                self._wait_started(self.head_ns, timeout_s=90)
                self._start_node(self.worker_ns, ["--address", self.address, "--node-ip-address", self.worker_ip])
                self._wait_started(self.worker_ns, timeout_s=90)
                return self
            except BaseException:
                self.close()
                if attempt == self.attempts:
                    raise
                self.procs = []
                self.temp_dir = tempfile.mkdtemp(prefix="kvnetns-")
        raise AssertionError("unreachable")

    def __exit__(self, *exc) -> None:
        self.close()

    def run_in_head(self, argv: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a command inside the head's namespace (the driver lives there)."""
        return subprocess.run(["ip", "netns", "exec", self.head_ns, *argv], capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, **RAY_ENV, **(env or {})})

    def close(self) -> None:
        for proc in self.procs:  # ray start --block stops its own children on SIGTERM
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for ns in (self.worker_ns, self.head_ns):
            self._kill_namespace_pids(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        return [pid for ns in (self.head_ns, self.worker_ns) for pid in self._namespace_pids(ns)]

    # -------------------------------------------------------------- helpers
    def _make_network(self) -> None:
        veth_h, veth_w = f"v{self.head_ns}", f"v{self.worker_ns}"
        _ip("netns", "add", self.head_ns)
        _ip("netns", "add", self.worker_ns)
        _ip("link", "add", veth_h, "type", "veth", "peer", "name", veth_w)
        _ip("link", "set", veth_h, "netns", self.head_ns)
        _ip("link", "set", veth_w, "netns", self.worker_ns)
        _ip("-n", self.head_ns, "addr", "add", f"{self.head_ip}/24", "dev", veth_h)
        _ip("-n", self.worker_ns, "addr", "add", f"{self.worker_ip}/24", "dev", veth_w)
        for ns, dev in ((self.head_ns, veth_h), (self.worker_ns, veth_w)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")

    def _start_node(self, ns: str, args: list[str]) -> None:
        env = {**os.environ, **RAY_ENV}
        log = open(os.path.join(self.temp_dir, f"{ns}.log"), "w")  # noqa: SIM115 (lives with the process)
        self.procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, str(RAY_BIN), "start", "--block", "--num-cpus", str(self.cpus_per_node),
             "--disable-usage-stats", *args], stdout=log, stderr=subprocess.STDOUT, env=env))

    def _wait_started(self, ns: str, timeout_s: float) -> None:
        """Until the node's ``ray start`` says it is up (its raylet registered with the GCS)."""
        log = Path(self.temp_dir) / f"{ns}.log"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.3)
        raise RuntimeError(f"Ray node in {ns} did not start within {timeout_s:.0f}s:\n"
                           + log.read_text(errors="replace")[-2000:])

    @staticmethod
    def _namespace_pids(ns: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []

    def _kill_namespace_pids(self, ns: str, wait_s: float = 5.0) -> None:
        """SIGTERM what runs in the namespace, SIGKILL what is left ``wait_s`` later; waits up to
        ``wait_s`` for the namespace to be empty after each (a caller checks ``leftover_pids``)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self._namespace_pids(ns)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while pids and time.monotonic() < deadline:
                time.sleep(0.1)
                pids = self._namespace_pids(ns)
            if not pids:
                return
