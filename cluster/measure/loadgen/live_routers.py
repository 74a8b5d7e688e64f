"""Routers as processes of their own in front of the same replicas: kvmesh's and the peers' (``--router NAME``).

    kvmesh               ``kvmesh router`` at its default policy (``kvmesh:POLICY``: another; ``kvmesh:POLICY@K=V@K=V``:
                         with those ``--policy-kwargs``; ``kvmesh:POLICY@--flag=V``: with that router flag), fed by
                         the events
    vllm-router          vllm-router ``cache_aware`` at its CLI defaults (a tree of the text it routed)
    vllm-router:kv_aware vllm-router ``kv_aware`` subscribed to the replicas' KV event and replay sockets
    sglang-router        sglang-router ``cache_aware`` at its CLI defaults

The peers are found as ``DIR/*/bin/vllm-router`` and ``DIR/*/bin/sglang-router`` (DIR: ``--peers-dir``, else
``$KVMESH_PEERS_DIR``, else ``../peers`` beside the checkout), each in a virtualenv outside the repository.
Each run starts its router afresh, after every replica's prefix cache is reset (``POST /reset_prefix_cache``):
every router starts cold, on caches that hold nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvmesh.router.config import ReplicaSpec

ROOT = Path(__file__).resolve().parents[3]
PEER_EXECUTABLES = {"vllm-router": "vllm-router", "sglang-router": "sglang-router"}
"""A peer's name -> its executable in its virtualenv."""
ROUTER_NAMES = ("kvmesh", "vllm-router", "vllm-router:kv_aware", "vllm-router:round_robin", "sglang-router")
"""The routers ``--router`` names (``kvmesh:POLICY`` names kvmesh's router at another policy, ``kvmesh:POLICY@K=V``
at that policy with a knob set, as ``--policy-kwargs K=V``; ``kvmesh:POLICY@--flag=V`` with one of the router's own
flags)."""


@dataclass(frozen=True, slots=True)
class LiveFleet:
    """What every router is started in front of."""

    replicas: tuple[ReplicaSpec, ...]
    """The replicas, with their event and replay endpoints."""
    model: str
    """The model's path (kvmesh's router tokenizes with it)."""
    served_model_name: str
    """The name the replicas serve under (vllm-router's ``--kv-event-model``)."""
    block_size: int
    """The replicas' KV block size."""
    max_model_len: int | None = None
    """The replicas' context (``/server_info``), given to kvmesh's router: its tokenizer's own context would refuse
    longer prompts the replicas serve."""


def peers_dir(given: str | None) -> Path:
    """Where the peers' virtualenvs are: ``given``, else ``$KVMESH_PEERS_DIR``, else ``../peers`` beside the
    checkout."""
    return Path(given or os.environ.get("KVMESH_PEERS_DIR") or ROOT.parent / "peers")


def find_peer(name: str, folder: Path) -> Path | None:
    """The executable of peer ``name`` in ``folder/*/bin``; None when it is not installed there."""
    hits = sorted(folder.glob(f"*/bin/{PEER_EXECUTABLES[name]}"))
    return hits[0] if hits else None


def check_router_name(name: str) -> None:
    base, _, policy = name.partition(":")
    if base == "kvmesh":
        _policy_flags(policy)
        return
    if name in ROUTER_NAMES:
        return
    raise ValueError(f"--router must be one of {', '.join(ROUTER_NAMES)} or kvmesh:POLICY[@K=V...]; got {name!r}")


def _policy_flags(spec: str) -> list[str]:
    """``POLICY@K=V@--flag=V`` (after ``kvmesh:``) as kvmesh router's flags: ``K=V`` a ``--policy-kwargs`` knob,
    ``--flag`` or ``--flag=V`` one of ``kvmesh router``'s own flags (``--no-admission-enabled``); a ValueError naming
    a knob without ``=``."""
    policy, *items = spec.split("@")
    if items and not policy:
        raise ValueError(f"kvmesh:POLICY@K=V names its policy before its knobs; got kvmesh:{spec}")
    flags = [k for k in items if k.startswith("--")]
    knobs = [k for k in items if not k.startswith("--")]
    if bad := [k for k in knobs if not k.partition("=")[0] or not k.partition("=")[2]]:
        raise ValueError(f"kvmesh:POLICY@K=V takes NAME=VALUE knobs or --flags; got {', '.join(map(repr, bad))}")
    return (["--policy", policy] if policy else []) + (["--policy-kwargs", *knobs] if knobs else []) + flags


def router_command(name: str, fleet: LiveFleet, folder: Path) -> list[str]:
    """The command line (without ``--port``) that starts router ``name`` in front of ``fleet``; a ValueError
    naming the missing executable when a peer is not installed."""
    check_router_name(name)
    base, _, policy = name.partition(":")
    urls = [s.url for s in fleet.replicas]
    if base == "kvmesh":
        cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "router", "--model", fleet.model, "--host", "127.0.0.1",
               "--block-size", str(fleet.block_size), "--log-level", "warning"]
        cmd += ["--max-model-len", str(fleet.max_model_len)] if fleet.max_model_len else []
        for s in fleet.replicas:
            cmd += ["--replica", ",".join([s.url] + [f"{k}={v}" for k, v in (("events", s.events),
                                                                              ("replay", s.replay)) if v])]
        return cmd + _policy_flags(policy)
    exe = find_peer(base, folder)
    if exe is None:
        raise ValueError(f"{base} is not installed: no {folder}/*/bin/{PEER_EXECUTABLES[base]} "
                         f"(python3 -m venv {folder}/X && {folder}/X/bin/pip install {base}; or --peers-dir)")
    from kvmesh.cluster.measure.loadgen.processes import free_port

    cmd = [str(exe), *(["launch"] if base == "sglang-router" else []), "--worker-urls", *urls, "--host", "127.0.0.1",
           "--policy", policy or "cache_aware", "--log-level", "warn" if base == "sglang-router" else "warning",
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    if policy == "kv_aware":
        for s in fleet.replicas:
            if s.events is None:
                raise ValueError(f"vllm-router:kv_aware needs the replicas' event endpoints; {s.url} has none")
            cmd += ["--kv-event-source", f"{s.url}={s.events}"]
            cmd += ["--kv-event-replay-source", f"{s.url}={s.replay}"] if s.replay else []
        cmd += ["--kv-event-block-size", str(fleet.block_size), "--kv-event-model", fleet.served_model_name]
    return cmd


@contextlib.contextmanager
def running_router(cmd: list[str], label: str, timeout_s: float = 120.0) -> Iterator[str]:
    """``cmd --port P`` as a process until the block ends: its URL once ``/health`` answers 200."""
    from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes, wait_http

    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"kvmesh-compare-{label.replace(':', '-')}-{port}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "NO_COLOR": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(url, timeout_s=timeout_s, proc=proc)
        except RuntimeError as e:
            tail = log_path.read_text(errors="replace")[-1500:]
            raise ValueError(f"router {label} did not start: {e}; its log ({log_path}) ends:\n{tail}") from None
        yield url
    finally:
        stop_processes([proc], 15)


def reset_prefix_caches(replicas: tuple[ReplicaSpec, ...], admin_key: str | None) -> None:
    """Every replica's prefix cache emptied (``POST /reset_prefix_cache``, the admin plane); a ValueError naming
    the replica that refuses."""
    for s in replicas:
        status, text = _call(s.url + "/reset_prefix_cache", admin_key, method="POST")
        if status in (401, 403):
            raise ValueError(f"{s.url}/reset_prefix_cache refused ({status}): pass --admin-key")
        if status != 200:
            raise ValueError(f"{s.url}/reset_prefix_cache answered {status}: {text[:200]}")


def _call(url: str, admin_key: str | None, method: str = "GET") -> tuple[int, str]:
    """(status, body text) of one admin-plane call (the standard library's client: the package uses aiohttp only
    on its event loops)."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


COUNTERS = {"vllm:request_success_total": "requests", "vllm:prefix_cache_queries_total": "prefix_cache_queries",
            "vllm:prefix_cache_hits_total": "prefix_cache_hits"}
"""The replicas' own counters read around each run (``GET /metrics``), by the name a row gives them."""


def metric_lines(url: str, admin_key: str | None = None) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample a Prometheus ``GET url`` answers (its text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(_call(url, admin_key)[1]):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def replica_counters(replicas: tuple[ReplicaSpec, ...], admin_key: str | None) -> list[dict[str, float]]:
    """Each replica's counters now (``COUNTERS``, summed over their labels), in the fleet's order."""
    out = []
    for s in replicas:
        counts = dict.fromkeys(COUNTERS.values(), 0.0)
        for name, _, value in metric_lines(s.url + "/metrics", admin_key):
            if name in COUNTERS:
                counts[COUNTERS[name]] += value
        out.append(counts)
    return out
