"""Shared builders for router tests: events for a token chain, fake loads."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import xxhash
from kvmesh.events.schema import BlockRemoved, BlockStored


def ext_hashes(token_ids, block_size, salt=""):
    """Fake replica-side external hashes of each full block (a chain, like the real ones)."""
    out, parent = [], 0
    for i in range(len(token_ids) // block_size):
        blk = token_ids[i * block_size:(i + 1) * block_size]
        parent = xxhash.xxh3_64_intdigest(f"{salt}|{parent}|{blk}".encode())
        out.append(parent)
    return out


def stored(token_ids, block_size, start_block=0, num_blocks=None, salt="", extra_keys=None, medium="GPU"):
    """BlockStored for blocks [start_block, start_block + num_blocks) of a prompt (medium "CPU": a host tier)."""
    hashes = ext_hashes(token_ids, block_size, salt)
    end = len(hashes) if num_blocks is None else start_block + num_blocks
    return BlockStored(
        block_hashes=hashes[start_block:end],
        parent_block_hash=hashes[start_block - 1] if start_block else None,
        token_ids=list(token_ids[start_block * block_size:end * block_size]),
        block_size=block_size, lora_id=None, medium=medium, lora_name=None,
        extra_keys=extra_keys,
    )


def removed(token_ids, block_size, blocks, salt="", medium="GPU"):
    hashes = ext_hashes(token_ids, block_size, salt)
    return BlockRemoved(block_hashes=[hashes[i] for i in blocks], medium=medium)


@contextlib.contextmanager
def stub_replica(delay_ms: int):
    """An instant stub replica (cluster/measure/benchmarks/support/fake_replica.py) answering after ``delay_ms``: its
    URL."""
    proc = subprocess.Popen([sys.executable, "-m", "kvmesh.cluster.measure.benchmarks.support.fake_replica", "--port",
                             "0",
                             "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"
    finally:
        proc.terminate()
        proc.wait(10)


def candidates(loads):
    """A policy's candidates without a router: one record per id of ``loads``, holding its load, in that order."""
    from kvmesh.router.replicas.replica import Replica
    from kvmesh.router.routing.candidates import Candidates

    return Candidates.of([Replica(rid, load=load) for rid, load in loads.items()])


def plain(candidates):
    """The same candidates with their loads as a plain dict: priced one by one, not from the load columns."""
    from kvmesh.router.routing.candidates import Candidates

    return Candidates(dict(candidates.loads), list(candidates))


LAYOUT = {"model": "stories", "dtype": "bfloat16", "block_size": 16, "scales_digest": "",
          "cache_layout": "L,2,H,blocks,B,D", "tp_size": 1, "transport": "nixl"}
"""``/load``'s ``kv_transfer.layout`` of a replica with transfer on (router/replicas/kv_share.py)."""
