"""``kvmesh replica`` processes started for a comparison (``kvmesh bench compare-policies --launch-replicas N``):
each on free ports, with its KV event and replay sockets, stopped when the comparison ends."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kvmesh.cluster.measure.loadgen.live_routers import LiveFleet
from kvmesh.router.config import ReplicaSpec


@contextlib.contextmanager
def launched_replicas(n: int, model: str, extra_args: str = "", timeout_s: float = 180.0) -> Iterator[LiveFleet]:
    """``n`` replicas of ``model`` (``kvmesh replica --port 0 --event-port 0 --replay-port 0`` + ``extra_args``)
    until the block ends; a ValueError with the log's end when one does not start."""
    from kvmesh.cluster.measure.loadgen.processes import stop_processes, wait_http

    procs: list[subprocess.Popen] = []
    try:
        ends = [_start(model, extra_args, procs) for _ in range(n)]
        for e, proc in zip(ends, procs, strict=True):
            wait_http(e["http_url"], timeout_s=timeout_s, proc=proc)
        specs = tuple(ReplicaSpec(url=e["http_url"], events=e.get("events_endpoint"), replay=e.get("replay_endpoint"),
                                  replica_id=f"replica-{i}") for i, e in enumerate(ends))
        names = ends[0]["served_model_name"]
        yield LiveFleet(specs, model, names[0] if isinstance(names, list) else names, int(ends[0]["block_size"]),
                        ends[0].get("max_model_len"))
    finally:
        stop_processes(procs, 15)


def _start(model: str, extra_args: str, procs: list[subprocess.Popen]) -> dict:
    """One replica started (appended to ``procs``): the endpoints it printed on its first line."""
    log = Path(tempfile.gettempdir()) / f"kvmesh-compare-replica-{len(procs)}.log"
    cmd = [sys.executable, "-m", "kvmesh.cluster.cli", "replica", "--model", model, "--host", "127.0.0.1",
           "--port", "0", "--event-port", "0", "--replay-port", "0", *shlex.split(extra_args)]
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    procs.append(proc)
    line = proc.stdout.readline() if proc.stdout else ""  # the endpoints' JSON, once it serves
    try:
        return json.loads(line)
    except ValueError:
        tail = log.read_text(errors="replace")[-1500:]
        raise ValueError(f"kvmesh replica did not start ({' '.join(cmd)}); its log ({log}) ends:\n{tail}") from None
