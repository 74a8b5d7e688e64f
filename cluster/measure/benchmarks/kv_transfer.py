"""Benchmark of moving KV blocks between two processes by block id (replica/kv_transfer/, NIXL over UCX).

    kvmesh bench kv-transfer [--out results/kv_transfer.json] [--blocks 1 16 256] [--repeat 20]
                             [--layouts L,2,blocks,B,H,D L,2,H,blocks,B,D]
                             [--progress-delay-us 1000 0 --rounds 3]   interleaved A/B of nixl's progress thread
    kvmesh bench kv-transfer --http [...]   per-request overhead of an HTTP pull (kv_transfer_http.py)
    kvmesh bench kv-transfer --step-trace [...]   engine step time during a 512 MiB pull (kv_transfer_steps.py)

A holder process registers a synthetic cache (by default a Llama-3.2-1B-sized rank: 16 layers,
8 KV heads of 64, 16-token blocks, bf16: 512 KiB per block) and the reader, this process, reads
N scattered blocks from it into scattered local blocks, ``--repeat`` times per N. For each N:
wall and CPU (this process) seconds per read, median and best, and GB/s on the median; the
per-request overhead is the median of a one-block read, and the reader's CPU per descriptor
(one contiguous run: region of a block) is taken from the largest read. Copying as
many bytes in one run inside one process (``memcpy``) is the baseline: what this machine's memory allows. The last read
of each N is checked byte for byte. Both the torch
backend's head-major layout (one run per layer, K/V and head: more, smaller descriptors) and the
flash/triton layout (one run per layer and K/V) are measured. The holder's CPU is read too: per
second idle (before the reads) and over the reads, for each progress-thread delay given (rounds
interleave them). Writes JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

FLASH_LAYOUT, TORCH_LAYOUT = "L,2,blocks,B,H,D", "L,2,H,blocks,B,D"


def _block_ids(rng: random.Random, num_blocks: int, blocks: int, contiguous: bool) -> list[int]:
    """``blocks`` ids out of 1..num_blocks-1: one run (a fresh pool's allocation) or scattered (a used one's)."""
    if contiguous:
        start = rng.randrange(1, num_blocks - blocks + 1)
        return list(range(start, start + blocks))
    return rng.sample(range(1, num_blocks), blocks)


def _read_times(agent, peer: str, layout, blocks: int, repeat: int, rng: random.Random, cache, holder_cache,
                contiguous: bool = False):
    """[(wall s, cpu s)] of ``repeat`` reads of ``blocks`` blocks into ``cache``; the last read checked
    against ``holder_cache`` (the holder's copy)."""
    import torch
    from kvmesh.replica.kv_transfer.agent import read_blocks

    times = []
    for _ in range(repeat):
        remote = _block_ids(rng, layout.num_blocks, blocks, contiguous)
        local = _block_ids(rng, layout.num_blocks, blocks, contiguous)
        w0, c0 = time.perf_counter(), time.process_time()
        read_blocks(agent, peer, remote, local)
        times.append((time.perf_counter() - w0, time.process_time() - c0))
    def per_block(c):
        return c.view(torch.uint8).view(layout.num_regions, layout.num_blocks, -1)

    if not torch.equal(per_block(cache)[:, local], per_block(holder_cache)[:, remote]):
        raise AssertionError(f"the {blocks} blocks read differ from the holder's")
    return times


def _memcpy_seconds(cache, holder_cache, nbytes: int, repeat: int) -> float:
    """Best wall seconds of copying ``nbytes`` in one run inside this process: what memory alone allows (the
    best, as a copy this short is easily delayed by the other processes on the machine)."""
    import torch

    mine, theirs = cache.view(-1).view(torch.uint8)[:nbytes], holder_cache.view(-1).view(torch.uint8)[:nbytes]
    times = []
    for _ in range(repeat):
        w0 = time.perf_counter()
        mine.copy_(theirs)
        times.append(time.perf_counter() - w0)
    return min(times)


def _cpu_s(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def bench_layout(kv_layout: str, block_counts: list[int], repeat: int, progress_delay_us: int = 1000) -> dict:
    import psutil
    import torch
    from kvmesh.cluster.measure.benchmarks.support.kv_peer import HolderSpec, receive_holder, start_holder
    from kvmesh.replica.kv_layout import block_layout
    from kvmesh.replica.kv_transfer.agent import KVTransferConfig, decode_handshake, make_kv_transfer_agent

    spec = HolderSpec("bench-holder", kv_layout=kv_layout, num_kv_blocks=max(block_counts) + 1,
                      progress_delay_us=progress_delay_us)
    conn, process = start_holder(spec)
    try:
        ready = receive_holder(conn)
        handshake, holder_cache = ready.handshake, ready.cache
        cache = torch.zeros(spec.synthetic_shape(), dtype=getattr(torch, spec.dtype))
        layout = block_layout(cache, kv_layout, spec.block_size, spec.num_kv_heads, spec.head_dim)
        agent = make_kv_transfer_agent(KVTransferConfig(progress_delay_us=progress_delay_us), "bench-reader",
                                       cache, layout)
        holder = psutil.Process(process.pid)
        idle0, w0 = _cpu_s(holder), time.perf_counter()
        time.sleep(1.0)
        holder_idle = (_cpu_s(holder) - idle0) / (time.perf_counter() - w0)
        w0 = time.perf_counter()
        peer = agent.add_peer(decode_handshake(handshake))
        handshake_s = time.perf_counter() - w0
        rng, rows = random.Random(0), []
        _read_times(agent, peer, layout, 1, 3, rng, cache, holder_cache)  # warm the connection
        holder0, reads = _cpu_s(holder), 0
        for blocks, contiguous in ((b, c) for c in (False, True) for b in block_counts):
            times = _read_times(agent, peer, layout, blocks, repeat, rng, cache, holder_cache, contiguous)
            reads += repeat
            wall, cpu = [t[0] for t in times], [t[1] for t in times]
            nbytes = blocks * layout.bytes_per_block
            memcpy_s = _memcpy_seconds(cache, holder_cache, nbytes, repeat)
            rows.append({"blocks": blocks, "contiguous": contiguous, "bytes": nbytes,
                         "memcpy_best_gb_per_s": nbytes / memcpy_s / 1e9, "wall_median_s": statistics.median(wall),
                         "wall_best_s": min(wall), "cpu_median_s": statistics.median(cpu),
                         "gb_per_s": nbytes / statistics.median(wall) / 1e9,
                         "descriptors": blocks * layout.num_regions})
            order = "contiguous" if contiguous else "scattered "
            print(f"delay {progress_delay_us:>5} us {kv_layout} {blocks:>4} {order} blocks: "
                  f"{rows[-1]['wall_median_s'] * 1e3:8.3f} ms median ({rows[-1]['gb_per_s']:.2f} GB/s; "
                  f"memcpy best {rows[-1]['memcpy_best_gb_per_s']:.2f} GB/s), "
                  f"cpu {rows[-1]['cpu_median_s'] * 1e3:.3f} ms", flush=True)
        holder_read_cpu = (_cpu_s(holder) - holder0) / reads
        print(f"delay {progress_delay_us:>5} us {kv_layout}: holder CPU {holder_idle:.3f} s/s idle, "
              f"{holder_read_cpu * 1e3:.3f} ms per read", flush=True)
        agent.close()
    finally:
        if process.is_alive():
            conn.send("exit")
        process.join(timeout=60)
    largest = max((r for r in rows if not r["contiguous"]), key=lambda r: r["blocks"])
    return {"kv_layout": kv_layout, "progress_delay_us": progress_delay_us, "holder_idle_cpu_s_per_s": holder_idle,
            "holder_cpu_s_per_read": holder_read_cpu, "bytes_per_block": layout.bytes_per_block,
            "regions_per_block": layout.num_regions,
            "dtype": spec.dtype, "handshake_s": handshake_s, "reads": rows,
            "per_request_overhead_s": rows[0]["wall_median_s"] if rows[0]["blocks"] == 1 else None,  # scattered 1
            "cpu_us_per_descriptor": largest["cpu_median_s"] / largest["descriptors"] * 1e6}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5))
    delays = sorted({run["progress_delay_us"] for run in results["layouts"]}, reverse=True)
    series = [(layout, contiguous) for layout in dict.fromkeys(r["kv_layout"] for r in results["layouts"])
              for contiguous in (False, True)]  # one colour each; one line style per progress delay
    for run in (r for r in results["layouts"] if r["round"] == 0):
        for contiguous in (False, True):
            reads = [r for r in run["reads"] if r["contiguous"] == contiguous]
            label = f"{run['kv_layout']} {'contiguous' if contiguous else 'scattered'}"
            label += f", progress delay {run['progress_delay_us']} us" if len(delays) > 1 else ""
            style = {"marker": "o", "label": label, "color": f"C{series.index((run['kv_layout'], contiguous))}",
                     "linestyle": ("-", "--", ":")[min(delays.index(run["progress_delay_us"]), 2)]}
            blocks = [r["blocks"] for r in reads]
            left.plot(blocks, [r["wall_median_s"] * 1e3 for r in reads], **style)
            right.plot(blocks, [r["gb_per_s"] for r in reads], **style)
    for axis, label in ((left, "ms per read (median)"), (right, "GB/s")):
        axis.set_xscale("log")
        axis.set_xlabel(f"blocks per read ({results['layouts'][0]['bytes_per_block'] // 1024} KiB each)")
        axis.set_ylabel(label)
    left.set_yscale("log")
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize="small")
    fig.subplots_adjust(bottom=0.1 + 0.045 * ((len(labels) + 1) // 2), top=0.9, wspace=0.25)
    fig.suptitle(f"KV block reads between two processes ({results['transport']})")
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--http" in argv:  # the per-request overhead of a pull over HTTP between replicas
        from kvmesh.cluster.measure.benchmarks.kv_transfer_http import main as http_main

        return http_main([a for a in argv if a != "--http"])
    if "--step-trace" in argv:  # engine step time while a large pull is in flight
        from kvmesh.cluster.measure.benchmarks.kv_transfer_steps import main as steps_main

        return steps_main([a for a in argv if a != "--step-trace"])
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench kv-transfer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/kv_transfer.json"), help="JSON output path")
    parser.add_argument("--blocks", type=int, nargs="+", default=[1, 16, 256], help="blocks per read")
    parser.add_argument("--repeat", type=int, default=20, help="reads per block count")
    parser.add_argument("--layouts", nargs="+", default=[FLASH_LAYOUT, TORCH_LAYOUT],
                        help="cache layouts to measure (flash/triton's and torch's)")
    parser.add_argument("--progress-delay-us", type=int, nargs="+", default=[1000],
                        help="nixl progress-thread delays to compare (KVTransferConfig.progress_delay_us)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each running every delay in turn")
    args = parser.parse_args(argv)
    if args.repeat <= 0 or min(args.blocks) <= 0 or len(set(args.blocks)) < 2:
        parser.error("--repeat and --blocks must be positive, with at least two different block counts")
    if args.rounds <= 0 or min(args.progress_delay_us) < 0:
        parser.error("--rounds must be positive and --progress-delay-us 0 or more")
    bad = [layout for layout in args.layouts if layout not in (FLASH_LAYOUT, TORCH_LAYOUT)]
    if bad:
        parser.error(f"unknown layouts {bad}; choose from {FLASH_LAYOUT} {TORCH_LAYOUT}")
    from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

    if nixl_missing():
        print(f"kvmesh bench kv-transfer: {nixl_missing()}", file=sys.stderr)
        return 2
    from kvmesh.replica.kv_transfer.errors import KVTransferError

    try:
        runs = [dict(bench_layout(layout, sorted(args.blocks), args.repeat, delay), round=r)
                for r in range(args.rounds) for delay in args.progress_delay_us for layout in args.layouts]
    except KVTransferError as e:
        print(f"kvmesh bench kv-transfer: {e}", file=sys.stderr)
        return 2
    results = {"machine": {"python": sys.version.split()[0], "platform": platform.platform()},
               "transport": "nixl (UCX)", "repeat": args.repeat,
               "layouts": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}", flush=True)
    return 0
