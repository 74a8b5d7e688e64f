"""The fleet the noisy-neighbour suite attacks: a ``kvmesh router`` in front of two ``kvmesh replica`` processes
of stories260K, each process its own (so its memory and threads are its own), two tenants' keys, and the readings
the suite takes of them (``Reading``: the router's view of each replica, each replica's ``/health``, each process's
resident memory and thread count, from /proc).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

KEYS = {"noisy": "sk-noisy-" + secrets.token_hex(8), "light": "sk-light-" + secrets.token_hex(8)}
"""The two tenants' keys (the keys file's)."""
ADMIN_KEY = "admin-" + secrets.token_hex(12)
INTERNAL_KEY = "int-" + secrets.token_hex(12)
"""The key the router reaches the replicas with (the suite's warm-up too)."""
KVMESH = str(Path(sys.executable).parent / "kvmesh")
START_S = 120.0
"""How long a process may take to serve (two models loading on a busy machine)."""


@dataclass
class Process:
    """A started kvmesh process: its URL and pid."""

    name: str
    popen: subprocess.Popen
    url: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=15)


@dataclass
class Reading:
    """One look at the fleet, at ``t`` (``time.monotonic``)."""

    t: float
    rss_mb: dict[str, float]
    threads: dict[str, int]
    thread_names: dict[str, Counter] = field(default_factory=dict)
    """Each process's threads by name (/proc/<pid>/task/*/comm)."""
    unhealthy: list[str] = field(default_factory=list)
    """What was wrong: a replica the router holds unhealthy or ejected, one whose /health failed."""
    ejections: int = 0


@dataclass
class NoisyFleet:
    router: Process
    replicas: list[Process]
    responses_db: Path
    """The router's stored responses (SQLite), the fleet's own (never the state directory other runs share)."""

    @property
    def url(self) -> str:
        return self.router.url

    def processes(self) -> list[Process]:
        return [self.router, *self.replicas]

    def read(self) -> Reading:
        """The fleet now (the module doc)."""
        reading = Reading(time.monotonic(), {p.name: _status(p.pid, "VmRSS") / 1024 for p in self.processes()},
                          {p.name: int(_status(p.pid, "Threads")) for p in self.processes()},
                          {p.name: _thread_names(p.pid) for p in self.processes()})
        rows = httpx.get(self.url + "/replicas", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        for row in rows.json()["replicas"]:
            reading.ejections += row.get("ejections", 0)
            if not row["healthy"] or row.get("ejected"):
                reading.unhealthy.append(f"router holds {row['id']} {'ejected' if row.get('ejected') else 'down'} "
                                         f"(last failure: {row.get('last_failure')})")
        for replica in self.replicas:
            try:
                status = httpx.get(replica.url + "/health", timeout=5).status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            if status != 200:
                reading.unhealthy.append(f"{replica.name} /health: {status}")
        return reading

    def stop(self) -> None:
        for p in self.processes():
            p.stop()


def _thread_names(pid: int) -> Counter:
    names: Counter = Counter()
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            names[comm.read_text().strip()] += 1
        except OSError:  # the thread ended meanwhile
            pass
    return names


def _status(pid: int, key: str) -> float:
    """A number from /proc/<pid>/status (``VmRSS`` in kB, ``Threads``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def _replica(name: str, model: Path, template: Path, env: dict, workdir: Path) -> Process:
    """A ``kvmesh replica`` started (its URL is known once it serves: ``_serving``)."""
    with (workdir / f"{name}.log").open("w") as stderr:
        popen = subprocess.Popen(
            [KVMESH, "replica", "--model", str(model), "--port", "0", "--event-port", "0", "--replay-port", "0",
             "--kv-cache-memory", "8MiB", "--chat-template", str(template)],
            stdout=subprocess.PIPE, stderr=stderr, env=env, text=True)
    return Process(name, popen, "")


def _serving(replica: Process, workdir: Path) -> dict:
    """Once ``replica`` serves: its endpoints (the line it prints then); its URL set from them."""
    popen = replica.popen
    line = next((line for line in popen.stdout if line.startswith("{")), None)
    assert line, (f"kvmesh replica {replica.name} exited with {popen.wait()}: "
                  f"{(workdir / f'{replica.name}.log').read_text()[-2000:]}")
    threading.Thread(target=popen.stdout.read, daemon=True).start()  # whatever else it prints, never blocking it
    endpoints = json.loads(line)
    replica.url = endpoints["http_url"]
    return endpoints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fleet(model: Path, workdir: Path, template_text: str) -> NoisyFleet:
    """Two replicas and a router with ``KEYS``' tenants, serving (the module doc)."""
    template = workdir / "chat.jinja"
    template.write_text(template_text)
    keys = workdir / "keys.yaml"
    keys.write_text("keys:\n" + "".join(f"  - {{key: {key}, tenant: {name}}}\n" for name, key in KEYS.items()))
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVMESH_")}
    base |= {"KVMESH_HASH_SEED": secrets.token_hex(16), "KVMESH_INTERNAL_KEY": INTERNAL_KEY}
    started: list[Process] = []
    try:
        started += [_replica(f"replica-{i}", model, template, base, workdir) for i in range(2)]  # both load at once
        specs = []
        for replica in started:
            endpoints = _serving(replica, workdir)
            specs.append(f"{replica.url},events={endpoints['events_endpoint']},"
                         f"replay={endpoints['replay_endpoint']},name={replica.name}")
        port = _free_port()
        with (workdir / "router.log").open("w") as stderr:
            popen = subprocess.Popen(
                [KVMESH, "router", "--model", str(model), "--port", str(port), "--chat-template", str(template),
                 "--admission-keys-file", str(keys), "--log-level", "warning",
                 "--responses-path", str(workdir / "responses.sqlite3"),
                 *(arg for spec in specs for arg in ("--replica", spec))],
                stdout=subprocess.DEVNULL, stderr=stderr, env={**base, "KVMESH_ADMIN_KEY": ADMIN_KEY})
        router = Process("router", popen, f"http://127.0.0.1:{port}")
        started.append(router)
        fleet = NoisyFleet(router, started[:2], workdir / "responses.sqlite3")
        _wait_serving(fleet)
        return fleet
    except BaseException:
        for p in started:
            p.stop()
        raise


def _wait_serving(fleet: NoisyFleet) -> None:
    """Until the router answers a tenant and holds both replicas healthy."""
    deadline, last = time.monotonic() + START_S, "nothing yet"
    while time.monotonic() < deadline:
        assert fleet.router.popen.poll() is None, f"kvmesh router exited with {fleet.router.popen.returncode}"
        try:
            r = httpx.post(fleet.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 1}, timeout=10,
                           headers={"Authorization": f"Bearer {KEYS['light']}"})
            last = f"{r.status_code} {r.text[:200]}"
            if r.status_code == 200:
                last = "; ".join(fleet.read().unhealthy)
                if not last:
                    return
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise AssertionError(f"the noisy fleet did not serve within {START_S}s: {last}")
