"""Server processes a measurement starts on this machine: a free loopback port, waiting until one answers, stopping
them (the benchmarks' drivers and ``compare-policies --router`` alike)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_processes(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Terminate every process, then wait for each (killing one that takes longer than ``timeout_s``)."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_http(url: str, path: str = "/health", timeout_s: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    """Until ``GET url+path`` answers 200; a RuntimeError when ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{' '.join(map(str, proc.args))} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}{path} did not answer 200 within {timeout_s:.0f} s")
