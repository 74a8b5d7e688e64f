"""NVIDIA Dynamo's KV router in front of its own mocker workers, from Dynamo's own virtualenv (``PEERS/dynamo``), given
what kvmesh's emulated replicas are given: the same step times, block size, KV blocks, step budget and time dilation.

Dynamo's router talks only to Dynamo's workers, so it cannot stand in front of kvmesh's replicas; its mocker is
Dynamo's counterpart of ``kvmesh replica --emulate`` (a vLLM-like scheduler, real block pools and KV events, the
forward pass replaced by a wait). The step times go to it as a mocker-format NPZ (``--planner-profile-data``) drawn
from kvmesh's cost model (replica/emulate/cost_model.py): its prefill time is linear in the step's new tokens, its
decode time is looked up by the batch's KV tokens and mean context length, which the cost model's per-step,
per-sequence and per-context-token terms give. Two processes: the frontend (file discovery, a TCP request plane, a
ZeroMQ event plane: no etcd, no NATS) and one mocker process holding every worker, at ``nice 15`` as kvmesh's fleet
is. How to install it: docs/benchmarks/live-verdict.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PEER = "dynamo"
"""The arm's name (at the KV router; ``dynamo:MODE`` at another ``--router-mode``), and its virtualenv's folder under
the peers' folder."""
ACTIVE_KV_TOKENS = (0, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536)
"""Decode grid: the batch's KV tokens (the mocker interpolates bilinearly between the points)."""
CONTEXT_TOKENS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Decode grid: the batch's mean context length."""
PREFILL_TOKENS = (1, 16, 64, 256, 1024, 4096, 8192)
"""Prefill points: a step's new prompt tokens (linear, so two would do)."""
TTFT_METRIC = "dynamo_component_router_time_to_first_token_seconds"
"""Dynamo's router's histogram of time to first token, per worker, from routing to the worker's first token (its
frontend's own ``dynamo_frontend_time_to_first_token_seconds`` counts no streamed request whose text is empty)."""
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Dynamo's frontend will not serve a model without a chat template (stories260K has none); the completions the
benchmark sends never use it."""


def dynamo_python(peers: Path) -> Path:
    """Dynamo's interpreter; a ValueError saying how to install it when it is not there."""
    python = peers / PEER / "bin" / "python"
    if not python.exists():
        raise ValueError(f"Dynamo is not installed at {peers / PEER}: see docs/benchmarks/live-verdict.md, "
                         "'Dynamo's arm', for the three pip commands")
    return python


def decode_ms(cost: dict, active_kv_tokens: float, context_tokens: float) -> float:
    """A decode step's milliseconds under kvmesh's cost model, for a batch of ``active_kv_tokens`` KV tokens whose
    mean context is ``context_tokens`` (so about ``active / context`` sequences). The step's fixed cost rides here:
    most steps only decode, and the mocker adds a prefill's time to a step that also prefills."""
    seqs = max(1.0, active_kv_tokens / context_tokens)
    return 1000 * (cost["step_overhead_s"] + cost["decode_s_per_step"] + cost["decode_s_per_seq"] * seqs
                   + cost["decode_s_per_context_token"] * active_kv_tokens)


def write_profile(cost: dict, path: Path) -> Path:
    """The mocker-format NPZ of kvmesh's cost model ``cost`` (``CostModel``'s fields, in seconds)."""
    import numpy as np

    isl = np.array(PREFILL_TOKENS, dtype=float)
    active, context = np.array(ACTIVE_KV_TOKENS, dtype=float), np.array(CONTEXT_TOKENS, dtype=float)
    itl = np.array([[decode_ms(cost, a, c) for c in context] for a in active])  # [active, context] ms
    np.savez(path, prefill_isl=isl, prefill_ttft_ms=1000 * cost["prefill_s_per_token"] * isl,
             decode_active_kv_tokens=active, decode_context_length=context, decode_itl=itl)
    return path


def model_dir(model: Path, work: Path) -> Path:
    """``model``'s files linked into ``work/model`` with a chat template added to its tokenizer config."""
    out = work / "model"
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.name != "tokenizer_config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config = json.loads((model / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHAT_TEMPLATE}))
    return out


@dataclass(frozen=True)
class DynamoFleet:
    """A running frontend and its mocker workers."""

    url: str
    """The frontend's OpenAI endpoint."""
    procs: tuple[subprocess.Popen, ...]
    """The mocker's process and the frontend's."""

    def router_ttft(self) -> dict[str, float]:
        """The router's own time-to-first-token histogram so far (``TTFT_METRIC``): its ``sum`` and ``count`` over
        every worker. The mocker's tokens decode to no text, so the frontend streams nothing before the last chunk,
        and a client's first chunk comes at the end: only the router sees the first token."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return ttft_totals(resp.read().decode())

    def cpu_s(self) -> tuple[float, float]:
        """CPU seconds so far of the mocker's workers and of the frontend (their process trees)."""
        from kvmesh.cluster.measure.benchmarks.support.peer_load import tree_cpu_seconds

        mocker, frontend = self.procs
        return tree_cpu_seconds(mocker.pid), tree_cpu_seconds(frontend.pid)


def ttft_totals(metrics: str) -> dict[str, float]:
    """``sum`` and ``count`` of the router's TTFT histogram in a Prometheus text page, over every label set."""
    totals = {"sum": 0.0, "count": 0.0}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        for kind in totals:
            if name.startswith(f"{TTFT_METRIC}_{kind}"):  # name{labels} or bare
                totals[kind] += float(value.split()[0])
    return totals


@contextmanager
def running_dynamo(python: Path, model: Path, profile: Path, sizes: dict, dilation: float, work: Path,
                   label: str, router_mode: str = "kv", timeout_s: float = 180.0) -> Iterator[DynamoFleet]:
    """Dynamo's mocker workers (``sizes``: replicas, blocks_per_replica, max_num_batched_tokens, max_num_seqs,
    max_model_len) and its frontend with its router at ``router_mode`` (its KV router by default), fresh (empty
    caches) until the block ends, from when the frontend lists the model."""
    from kvmesh.cluster.measure.loadgen.processes import free_port, stop_processes

    discovery = work / f"discovery-{label}"
    discovery.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(discovery), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    common = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    port = free_port()
    procs: list[subprocess.Popen] = []
    log = (work / f"dynamo-{label}.log").open("w")
    try:
        procs.append(subprocess.Popen(
            ["nice", "-n", "15", str(python), "-m", "dynamo.mocker", "--model-path", str(model), *common,
             "--num-workers", str(sizes["replicas"]), "--num-gpu-blocks-override", str(sizes["blocks_per_replica"]),
             "--block-size", "16", "--max-num-batched-tokens", str(sizes["max_num_batched_tokens"]),
             "--max-num-seqs", str(sizes["max_num_seqs"]), "--max-model-len", str(sizes["max_model_len"]),
             "--speedup-ratio", f"{1 / dilation:g}", "--planner-profile-data", str(profile)],
            env=env, stdout=log, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([str(python), "-m", "dynamo.frontend", "--http-port", str(port),
                                       "--router-mode", router_mode, *common],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        _wait_for_model(url, procs, timeout_s, work / f"dynamo-{label}.log")
        yield DynamoFleet(url, tuple(procs))
    finally:
        stop_processes(procs, 15)
        log.close()


def _wait_for_model(url: str, procs: list[subprocess.Popen], timeout_s: float, log: Path) -> None:
    """Until the frontend lists a model, then a few seconds more for every worker to register with it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"Dynamo's {p.args[4]} exited with code {p.returncode}; its log: {log}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                if json.loads(resp.read()).get("data"):
                    time.sleep(5.0)
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Dynamo's frontend listed no model within {timeout_s:.0f} s; its log: {log}")
