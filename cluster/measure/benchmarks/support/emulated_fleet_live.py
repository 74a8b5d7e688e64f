"""The live half of ``kvmesh bench emulated_fleet``: N emulated replicas in one ``kvmesh replica`` process, kvmesh's
router in front, ``kvmesh bench load`` replaying the trace; what it measured and what the replicas' ``/load`` said
of their timing. Every process runs at ``nice -n 15`` and is stopped at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvmesh.cluster.measure.benchmarks.support.peer_load import tree_cpu_seconds
from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes, wait_http
from kvmesh.cluster.measure.shared_dir import stories_model
from kvmesh.replica.emulate.cost_model import H100_8B_KV_BYTES_PER_TOKEN
from kvmesh.router.config import RouterConfig

MAX_MODEL_LEN = 8192
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LiveSettings:
    replicas: int
    num_requests: int
    max_prompt_tokens: int
    max_tokens: int
    dilation: float
    policy: str
    work: Path
    """A scratch folder: the profile file and the logs."""
    workload: str = "mooncake"
    """The trace workload replayed (``kvmesh bench load``'s)."""
    speedup: float = 1.0
    """Its records sent this many times as fast as their times say, in the GPU's time."""
    predict_hold_s: float = 0.0
    """The router's ``predict_hold_s`` in the GPU's time (0: the default, off)."""


def kvmesh(*args: str) -> list[str]:
    return ["nice", "-n", "15", sys.executable, "-m", "kvmesh.cluster.cli", *args]


def start_fleet(s: LiveSettings, sim: dict, procs: list[subprocess.Popen]) -> list[dict]:
    """The emulated replicas (one process): the simulator's cost model as their profile, its fleet's sizes."""
    profile = s.work / "profile.json"
    profile.write_text(json.dumps({"cost_model": sim["cost"], "kv_bytes_per_token": H100_8B_KV_BYTES_PER_TOKEN}))
    log = (s.work / "fleet.log").open("w")
    proc = subprocess.Popen(kvmesh(
        "replica", "--model", str(stories_model()), "--emulate", str(profile), "--emulate-time-dilation",
        f"{s.dilation:g}", "--num-replicas", str(s.replicas), "--port", "0", "--event-port", "0", "--replay-port", "0",
        "--num-kv-blocks", str(sim["blocks_per_replica"] + 1), "--kv-cache-memory", "256GiB",
        "--max-num-batched-tokens", str(sim["max_num_batched_tokens"]), "--max-num-seqs", str(sim["max_num_seqs"]),
        "--max-model-len", str(MAX_MODEL_LEN)), stdout=subprocess.PIPE, stderr=log, text=True)
    procs.append(proc)
    assert proc.stdout is not None
    ends = []
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(ends) < s.replicas:
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"the emulated fleet did not start; its log: {s.work / 'fleet.log'}")
        ends.append(json.loads(line))
    return ends


def dilated_router_flags(dilation: float, predict_hold_s: float = 0.0) -> list[str]:
    """The router's own clocks stretched as the fleet's steps are (``--emulate-time-dilation``): a routed request's
    blocks count as cached until its events can confirm them, and a request leaves the router's queue for a replica
    whose predicted wait is within the admission bound, both in the GPUs' time, not in the slower fleet's. Left as
    they are, a prediction of 2 s lasts an eighth of a GPU's 2 s at a dilation of 8, and a prompt still being
    computed is forgotten before its blocks are stored."""
    defaults = RouterConfig()
    return ["--predict-ttl-s", f"{defaults.predict_ttl_s * dilation:g}",
            "--admission-admit-ttft-s", f"{defaults.admission.admit_ttft_s * dilation:g}",
            "--predict-hold-s", f"{predict_hold_s * dilation:g}"]


def start_router(s: LiveSettings, ends: list[dict], procs: list[subprocess.Popen]) -> str:
    port = free_port()
    replicas = [a for e in ends for a in ("--replica", f"{e['http_url']},events={e['events_endpoint']},"
                                                       f"replay={e['replay_endpoint']}")]
    log = (s.work / "router.log").open("w")
    procs.append(subprocess.Popen(kvmesh("router", "--model", str(stories_model()), "--port", str(port),
                                         "--max-model-len", str(MAX_MODEL_LEN), "--block-size", "16",
                                         "--policy", s.policy, *dilated_router_flags(s.dilation, s.predict_hold_s),
                                         *replicas),
                                  stdout=log, stderr=subprocess.STDOUT))
    url = f"http://127.0.0.1:{port}"
    wait_http(url, timeout_s=READY_TIMEOUT_S, proc=procs[-1])
    time.sleep(3.0)  # every replica's probe and event stream in
    return url


def replay(s: LiveSettings, url: str) -> dict:
    out = s.work / "load.json"
    subprocess.run(kvmesh("bench", "load", "--url", url, "--workload", s.workload, "--num-requests",
                          str(s.num_requests),
                          "--max-prompt-tokens", str(s.max_prompt_tokens), "--max-tokens", str(s.max_tokens),
                          "--trace-block-tokens", "16", "--mode", "open", "--time-scale", f"{s.dilation / s.speedup:g}",
                          "--receipts", "--no-plot",
                          "--no-progress", "--out", str(out)), check=True, stdout=subprocess.DEVNULL,
                   timeout=600 * max(1.0, s.dilation / 8))  # the two workloads' replays take 8-9 min at a dilation of 8
    load = json.loads(out.read_text())
    return load["summary"] | {"ttft_by_request": {r["session_id"]: r["ttft_s"] for r in load["requests"]},
                              "cached_by_request": {r["session_id"]: r["cached_tokens"] for r in load["requests"]},
                              "receipt_by_request": {r["session_id"]: r["receipt"] for r in load["requests"]}}


def replica_timing(ends: list[dict]) -> list[dict]:
    rows = []
    for e in ends:
        with urllib.request.urlopen(e["http_url"] + "/load", timeout=10) as r:
            rows.append(json.loads(r.read())["emulation"])
    return rows


def run_live(s: LiveSettings, sim: dict) -> dict:
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.monotonic()
        ends = start_fleet(s, sim, procs)
        url = start_router(s, ends, procs)
        started_s = time.monotonic() - t0
        cpu0 = _cpu_s(procs)
        summary = replay(s, url)
        timing = replica_timing(ends)
        cpu_s = _cpu_s(procs) - cpu0
    finally:
        stop_processes(procs, 30)
    if summary["errors"]:
        raise RuntimeError(f"{summary['errors']} requests failed: {summary['error_samples'][:3]}")
    return {"cached_share": summary["cached_tokens"] / summary["prompt_tokens"], "ttft_s": summary["ttft_s"],
            "requests": summary["requests"], "duration_s": summary["duration_s"], "start_s": started_s,
            "fleet_and_router_cpu_s": cpu_s, "replicas": timing, "ttft_by_request": summary["ttft_by_request"],
            "cached_by_request": summary["cached_by_request"], "receipt_by_request": summary["receipt_by_request"]}


def _cpu_s(procs: list[subprocess.Popen]) -> float:
    """CPU seconds of the fleet and router processes so far."""
    return sum(tree_cpu_seconds(p.pid) for p in procs)
