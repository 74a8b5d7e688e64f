"""Engine step time while a large KV pull is in flight (``kvmesh bench kv-transfer --step-trace``).

    kvmesh bench kv-transfer --step-trace [--out results/kv_transfer_steps.json] [--pull-mib 512] [--rounds 8]
                                          [--seqs 4] [--quiet-s 1.0]

A serving engine (AsyncLLM, dummy weights of a Llama shape whose KV is 1 MiB per block: 16 layers, 8 KV heads
of 64, 16-token blocks, float32) decodes ``--seqs`` sequences without pause while, each round, a quiet window
(no pull) and two pulls of ``--pull-mib`` MiB (``AsyncLLM.pull_prefix``, the production path: blocks held on
the engine thread, the read on the agent's transfer worker) from a holder in another process over nixl (UCX,
host memory): one whose copy yields the CPU to the steps (the worker at nice ``pull_read.WORKER_NICE`` while it
starts the read), one at the engine's priority; the windows' order rotates each round. Every engine step is timed (wall,
and the engine thread's CPU); a step counts as "during the
pull" when it overlaps the pull, as "quiet" when it lies in a quiet window; a step's time runs from the end of the
previous one (the engine loop's commands and ``between_steps`` included: a read started on the engine thread
copies there) to its own end, the gap between two tokens of a decoding request. Also: this process's and the holder's
CPU per second in each kind of window. Writes JSON and a PNG beside it: step time over time with and without a
pull (one round), and the distributions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

SHAPE = dict(model_type="llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=16,
             num_attention_heads=8, num_key_value_heads=8, vocab_size=1000, max_position_embeddings=32768)
"""A small model on CPU whose KV block is a Llama-3.2-1B rank's size in float32 (1 MiB)."""
KINDS = ("quiet", "pull", "pull-equal")
"""Windows of a round: no pull; a pull whose copy yields the CPU (pull_read.WORKER_NICE); one at the engine's
priority (the worker's nice left at the process's)."""
DECODE_TOKENS = 200
"""Tokens each decoding sequence generates before it starts over (new prompt)."""


class StepClock:
    """Wraps ``engine.step``: (start, end, the engine thread's CPU seconds so far at the end) of every step."""

    def __init__(self, engine) -> None:
        self.steps: list[tuple[float, float, float]] = []
        step = engine.step

        def timed():
            w0 = time.perf_counter()
            try:
                return step()
            finally:
                self.steps.append((w0, time.perf_counter(), time.thread_time()))

        engine.step = timed


def _cpu_s(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def _decode_forever(serving, rng: random.Random, stop: asyncio.Event) -> None:
    from kvmesh.replica.serving.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True)
    while not stop.is_set():
        prompt = [rng.randrange(3, 1000) for _ in range(64)]
        async for _ in serving.generate(prompt, params):
            if stop.is_set():
                break


async def _trace(serving, agent, peer: str, num_blocks: int, args, holder) -> dict:
    import psutil
    from kvmesh.replica.kv_transfer import pull_read
    from kvmesh.replica.kv_transfer.errors import KVTransferError

    me, rng, nice = psutil.Process(), random.Random(0), args.copy_nice
    default_nice = pull_read.WORKER_NICE
    clock = StepClock(serving.engine)
    stop = asyncio.Event()
    load = [asyncio.ensure_future(_decode_forever(serving, random.Random(1000 + i), stop)) for i in range(args.seqs)]
    await asyncio.sleep(2.0)  # warm: every sequence decoding
    windows = []
    pulled = None
    for r in range(args.rounds):
        for kind in KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]:  # interleaved, order rotating
            c0, h0, w0 = _cpu_s(me), _cpu_s(holder), time.perf_counter()
            if kind != "quiet":
                pull_read.WORKER_NICE = nice if kind == "pull" else 0
                prompt = [rng.randrange(3, 1000) for _ in range(num_blocks * 16)]  # fresh: nothing cached
                remote = rng.sample(range(1, num_blocks + 1), num_blocks)
                try:
                    pulled = await serving.pull_prefix(agent, peer, prompt, remote)
                except KVTransferError as e:  # past kv_transfer.timeout_s: the copy starved
                    print(f"round {r} {kind}: {e}", flush=True)
                    pulled = None
                if pulled not in (None, 0, num_blocks * 16):  # 0: skipped, a failed pull's blocks still held
                    raise RuntimeError(f"the pull brought {pulled} tokens, not {num_blocks * 16}")
            else:
                await asyncio.sleep(args.quiet_s)
            w1 = time.perf_counter()
            windows.append({"kind": kind, "round": r, "start": w0, "end": w1,
                            "failed": kind != "quiet" and pulled != num_blocks * 16,
                            "cpu_s_per_s": (_cpu_s(me) - c0) / (w1 - w0),
                            "holder_cpu_s_per_s": (_cpu_s(holder) - h0) / (w1 - w0)})
            await asyncio.sleep(0.3)  # settle between windows
    pull_read.WORKER_NICE = default_nice
    stop.set()
    await asyncio.gather(*load)
    return {"steps": clock.steps, "windows": windows}


def _steps_of(steps: list, windows: list, kind: str) -> list:
    """Steps overlapping (pull) or inside (quiet) the windows of ``kind``."""
    spans = [(w["start"], w["end"]) for w in windows if w["kind"] == kind]
    if kind != "quiet":
        return [s for s in steps if any(s[0] < b and s[1] > a for a, b in spans)]
    return [s for s in steps if any(s[0] >= a and s[1] <= b for a, b in spans)]


def _summary(steps: list, windows: list, kind: str) -> dict:
    """The steps of ``kind``'s windows: wall ms and engine-thread CPU ms; CPU per second of the windows."""
    spans = [(w["start"], w["end"]) for w in windows if w["kind"] == kind]
    chosen = _steps_of(steps, windows, kind)
    wall = sorted((s[1] - s[0]) * 1e3 for s in chosen)
    if not wall:
        return {"steps": 0}
    cpu = [s[2] * 1e3 for s in chosen]
    return {"steps": len(wall), "wall_ms_median": statistics.median(wall), "wall_ms_mean": statistics.fmean(wall),
            "wall_ms_p90": wall[int(0.9 * (len(wall) - 1))], "wall_ms_max": wall[-1],
            "engine_thread_cpu_ms_mean": statistics.fmean(cpu),
            "window_s": [round(b - a, 4) for a, b in spans],
            "window_s_median": statistics.median(b - a for a, b in spans),
            "failed_pulls": sum(w["failed"] for w in windows if w["kind"] == kind),
            "process_cpu_s_per_s": statistics.fmean(w["cpu_s_per_s"] for w in windows if w["kind"] == kind),
            "holder_cpu_s_per_s": statistics.fmean(w["holder_cpu_s_per_s"] for w in windows if w["kind"] == kind)}


def bench_step_trace(args: argparse.Namespace) -> dict:
    import psutil
    from kvmesh.cluster.measure.benchmarks.support.engines import make_engine
    from kvmesh.cluster.measure.benchmarks.support.kv_peer import HolderSpec, receive_holder, start_holder
    from kvmesh.replica.engine.async_llm import AsyncLLM
    from kvmesh.replica.kv_transfer.agent import KVTransferConfig, agent_for_runner, decode_handshake

    engine = make_engine(None, SHAPE, max_num_seqs=max(args.seqs, 1), max_model_len=SHAPE["max_position_embeddings"],
                         kv_cache_memory=(args.pull_mib + 64 * args.seqs + 64) << 20, hash_seed="step-trace")
    serving = AsyncLLM(engine)
    agent = None
    try:
        agent = agent_for_runner(KVTransferConfig(), "step-trace-reader", serving.runner)
        layout = agent.layout
        num_blocks = (args.pull_mib << 20) // layout.bytes_per_block
        conn, process = start_holder(HolderSpec("step-trace-holder", kv_layout=layout.kv_layout,
                                                num_kv_blocks=num_blocks + 1, num_layers=layout.num_layers,
                                                block_size=layout.block_size, num_kv_heads=layout.num_kv_heads,
                                                head_dim=layout.head_dim,
                                                dtype=str(layout.dtype).removeprefix("torch.")))
        try:
            ready = receive_holder(conn)
            handshake = ready.handshake
            del ready  # its copy of the holder's cache is not needed here
            peer = agent.add_peer(decode_handshake(handshake))
            trace = asyncio.run(_trace(serving, agent, peer, num_blocks, args, psutil.Process(process.pid)))
        finally:
            if process.is_alive():
                conn.send("exit")
            process.join(timeout=60)
    finally:
        if agent is not None:
            agent.close()
        serving.shutdown()
    windows = trace["windows"]
    # one engine loop iteration per step: from the previous step's end (drained commands, between_steps: where
    # a read started on the engine thread would copy) to this one's end: the gap a decoding request sees
    steps = [(prev[1], step[1], step[2] - prev[2]) for prev, step in zip(trace["steps"][:-1], trace["steps"][1:],
                                                                       strict=True)]
    summaries = {k: _summary(steps, windows, k) for k in KINDS}
    t0 = windows[0]["start"]
    by_kind = {k: [round((b - a) * 1e3, 3) for a, b, _ in _steps_of(steps, windows, k)] for k in KINDS}
    quiet = summaries["quiet"]
    return {"step_ms_by_kind": by_kind, "pull_bytes": num_blocks * layout.bytes_per_block,
            "bytes_per_block": layout.bytes_per_block, "kv_layout": layout.kv_layout, "seqs": args.seqs,
            "rounds": args.rounds, "copy_nice": args.copy_nice, **summaries,
            "vs_quiet": {k: {"mean": summaries[k]["wall_ms_mean"] / quiet["wall_ms_mean"],
                             "median": summaries[k]["wall_ms_median"] / quiet["wall_ms_median"]} for k in KINDS[1:]},
            "windows": [dict(w, start=w["start"] - t0, end=w["end"] - t0) for w in windows],
            "steps": [(round(a - t0, 5), round((b - a) * 1e3, 3), round(c * 1e3, 3)) for a, b, c in steps]}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (trace, dist) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [2, 1]})
    windows = results["windows"]
    first = min(w["start"] for w in windows) - 0.3
    last = windows[min(2 * len(KINDS) - 1, len(windows) - 1)]["end"] + 0.3  # the first two rounds
    shown = [s for s in results["steps"] if first <= s[0] <= last]
    trace.plot([s[0] for s in shown], [s[1] for s in shown], ".-", markersize=3, linewidth=0.6, label="engine step")
    labels = {"quiet": "quiet (no pull)", "pull": f"pull of {results['pull_bytes'] >> 20} MiB, copy yielding the CPU",
              "pull-equal": "pull, copy at the engine's priority"}
    for w in windows:
        if w["start"] <= last:
            trace.axvspan(w["start"], w["end"], color=f"C{2 + KINDS.index(w['kind'])}", alpha=0.15,
                          label=labels[w["kind"]])
    handles, labels = trace.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    trace.legend(unique.values(), unique.keys(), fontsize="small")
    trace.set_xlabel("seconds")
    trace.set_ylabel("step ms (loop iteration)")
    trace.set_title("step time over time (two rounds)")
    data = [results["step_ms_by_kind"][k] for k in KINDS]
    dist.boxplot(data, tick_labels=["quiet", "pull\n(yielding)", "pull\n(equal)"], showfliers=True)
    dist.set_yscale("log")
    dist.set_ylabel("step ms (loop iteration)")
    ratios = ", ".join(f"{k} x{v['median']:.2f}" for k, v in results["vs_quiet"].items())
    dist.set_title(f"all {results['rounds']} rounds, median vs quiet: {ratios}", fontsize="small")
    fig.suptitle(f"engine steps ({results['seqs']} sequences decoding) with and without a KV pull (nixl, UCX)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench kv-transfer --step-trace",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/kv_transfer_steps.json"), help="JSON output path")
    parser.add_argument("--pull-mib", type=int, default=512, help="MiB each pull moves")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, each a quiet window and a pull")
    parser.add_argument("--seqs", type=int, default=4, help="sequences decoding throughout")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="seconds of each quiet window")
    parser.add_argument("--copy-nice", type=int, default=None,
                        help="the yielding pull's nice while it copies (default: pull_read.WORKER_NICE)")
    args = parser.parse_args(argv)
    if args.pull_mib <= 0 or args.rounds <= 0 or args.seqs <= 0 or args.quiet_s <= 0:
        parser.error("--pull-mib, --rounds, --seqs and --quiet-s must be positive")
    from kvmesh.replica.kv_transfer import pull_read
    from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

    args.copy_nice = pull_read.WORKER_NICE if args.copy_nice is None else args.copy_nice
    if nixl_missing():
        print(f"kvmesh bench kv-transfer: {nixl_missing()}", file=sys.stderr)
        return 2
    results = bench_step_trace(args)
    results["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(),
                          "cpus": os.cpu_count()}
    for kind in KINDS:
        s = results[kind]
        print(f"{kind:>10}: {s['steps']} steps, wall ms median {s['wall_ms_median']:.1f} mean {s['wall_ms_mean']:.1f} "
              f"p90 {s['wall_ms_p90']:.1f} max {s['wall_ms_max']:.1f}; engine thread CPU ms "
              f"{s['engine_thread_cpu_ms_mean']:.1f}; "
              f"process CPU {s['process_cpu_s_per_s']:.2f} s/s, holder {s['holder_cpu_s_per_s']:.2f} s/s; "
              f"window s median {s['window_s_median']:.2f}, failed pulls {s['failed_pulls']}", flush=True)
    for kind, ratio in results["vs_quiet"].items():
        print(f"step wall during a {kind} / quiet: median x{ratio['median']:.2f}, mean x{ratio['mean']:.2f}",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}", flush=True)
    return 0
