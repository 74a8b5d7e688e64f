"""The router's data plane without HTTP: body bytes -> token ids -> route decision -> upstream body bytes.

    kvmesh bench router_parse [--out results/router_parse.json] [--rounds 3]
        [--tree main=/path/to/other/checkout ...] [--profile workload]

CPU microseconds per request (process CPU, render-pool threads included) of what the router does between
receiving a request's body and having its upstream body and replica: ``RequestReader.parse_prompts`` +
``KVRouter.route`` + ``ProxyRequest.for_kind`` (a kvmesh upstream), on the three workloads of
``kvmesh bench router-peers`` (``workloads``): 1,000-token text completions, the same prompts as token
ids, and 8-turn chats resending their history (Llama-2 template). Per workload two numbers:
``first_us`` is the first pass (a chat's history, a prompt's shared prefix seen before, its new part
not) and ``warm_us`` later passes (every request seen before, as under ``wrk``'s replay).

Each ``--tree`` (another checkout's root, e.g. an export of main) runs in its own process, alternating
with this checkout round by round (interleaved A/B); medians are reported. ``--profile WORKLOAD`` runs
cProfile over warm passes of that workload in this checkout and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[3]
PATHS = {"text": False, "token_ids": False, "chat": True}  # workload -> chat


def _setup():
    """(forwarder, bodies): a router runtime with two healthy replicas (no HTTP), and the workloads' bodies."""
    from kvmesh.cluster.measure.benchmarks.router_peers import LLAMA2_CHAT_TEMPLATE, STORIES, workloads
    from kvmesh.replica.serving.tokenizer import load_tokenizer
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.runtime import RouterRuntime
    from kvmesh.router.http.proxy import Forwarder

    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(LLAMA2_CHAT_TEMPLATE)
    config = RouterConfig(model=str(STORIES), max_model_len=8192)
    config.frontend = type(config.frontend)(chat_template=f.name)
    runtime = RouterRuntime(config)
    for rid in ("r0", "r1"):
        runtime.router.add_replica(rid)
    bodies = {w: [b.encode() for b in items] for w, items in workloads(load_tokenizer(STORIES)).items()}
    plane = runtime.plane if hasattr(runtime, "plane") else runtime  # a --tree from before the data plane object
    return Forwarder(plane), bodies


async def _one(fwd, raw: bytes, chat: bool):
    from kvmesh.router.http.proxy_request import ProxyRequest
    from kvmesh.router.http.token_forwarding import KVMESH

    parsed = await fwd.reader.parse_prompts(raw, chat)
    decoded, req, prompts = parsed if len(parsed) == 3 else (raw, *parsed)  # a --tree whose request keeps the bytes
    ids = prompts[0] if prompts else []
    plane = fwd.plane if hasattr(fwd,
                                 "plane") else fwd.runtime  # a --tree from before the data plane had its own object
    decision = plane.router.route(ids, req.cache_salt, exclude=[], session_id=req.user)
    body = ProxyRequest(decoded, req, prompts, chat, plane.config.tokenize.forward_token_ids).for_kind(KVMESH)
    return decision, body


async def _pass(fwd, items: list[bytes], chat: bool) -> float:
    t0 = time.process_time_ns()
    for raw in items:
        await _one(fwd, raw, chat)
    return (time.process_time_ns() - t0) / len(items) / 1e3


def worker(passes: int) -> dict:
    """One round in this process: per workload, the first pass and the median of ``passes`` warm ones."""
    fwd, bodies = _setup()

    async def run() -> dict:
        out = {}
        for name, items in bodies.items():
            first = await _pass(fwd, items, PATHS[name])
            warm = [await _pass(fwd, items, PATHS[name]) for _ in range(passes)]
            out[name] = {"first_us": first, "warm_us": statistics.median(warm)}
        return out

    return asyncio.run(run())


def profile(workload: str, passes: int) -> None:
    import cProfile
    import pstats

    fwd, bodies = _setup()
    items, chat = bodies[workload], PATHS[workload]

    async def run() -> None:
        await _pass(fwd, items, chat)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(passes):
            await _pass(fwd, items, chat)
        prof.disable()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(15)
        split: dict[str, float] = {}
        for (path, _, func), (_, _, own, _, _) in stats.stats.items():
            where = next((name for name, marks in SPLIT if any(m in path or m in func for m in marks)), "other")
            split[where] = split.get(where, 0.0) + own
        total = sum(split.values())
        print("own time by part (cProfile, so Python-heavy parts look bigger):")
        for name, own in sorted(split.items(), key=lambda kv: -kv[1]):
            print(f"  {100 * own / total:5.1f}%  {name}")

    asyncio.run(run())


def use_tree(root: Path) -> None:
    """Import ``kvmesh.*`` from the checkout ``root`` in this process (its folders mapped as setup.py does)."""
    import importlib.machinery
    import importlib.util
    import types

    pkg = types.ModuleType("kvmesh")
    pkg.__path__ = []
    sys.modules["kvmesh"] = pkg

    class TreeFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            parts = name.split(".")
            if parts[0] != "kvmesh" or len(parts) != 2:
                return None
            return importlib.util.spec_from_file_location(name, root / parts[1] / "__init__.py",
                                                          submodule_search_locations=[str(root / parts[1])])

    sys.meta_path.insert(0, TreeFinder)
    import kvmesh.router.http.proxy as forward

    assert Path(forward.__file__).resolve().is_relative_to(root.resolve()), forward.__file__


SPLIT = (  # part -> markers of its functions' files or names (first match wins)
    ("chat template (jinja2)", ("jinja2", "<template>", "chat_template.py")),
    ("upstream body", ("proxy_request.py", "json_encode")),
    ("JSON decode", ("json_decode",)),
    ("sampling params", ("sampling_params.py", "to_sampling_params")),
    ("tokenize (cache + tokenizers)", ("tokenize_cache.py", "encode", "re.Pattern", "move_to_end", "OrderedDict")),
    ("validation (pydantic, token-id checks)", ("validate_python", "errors.py", "convert", "protocol.py",
                                                "tokenizer.py", "renderer.py", "body.py")),
    ("route (keys, match, policy, predictions)", ("kv_router.py", "index.py", "policies", "keys.py", "_fastpath",
                                                  "predictions.py", "receipts.py", "session.py", "load.py")),
    ("event loop / thread pool", ("asyncio", "concurrent", "selectors", "queue", "threading", "epoll")),
    ("glue (proxy.py, this loop)", ("proxy.py", "router_parse.py")),
)


def _in_tree(tree: Path, passes: int) -> dict:
    """A worker round in a fresh process that imports kvmesh from ``tree``."""
    cmd = [sys.executable, __file__, "--worker", str(tree), "--passes", str(passes)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker on {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, prog="kvmesh bench router_parse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/router_parse.json")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per tree (medians reported)")
    ap.add_argument("--passes", type=int, default=3, help="warm passes over each workload per round")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="another checkout to compare (run alternately with this one)")
    ap.add_argument("--profile", choices=sorted(PATHS), help="cProfile warm passes of one workload instead")
    ap.add_argument("--worker", metavar="TREE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        use_tree(Path(args.worker))
        print(json.dumps(worker(args.passes)))
        return 0
    if args.profile:
        profile(args.profile, args.passes)
        return 0
    trees = {"this": HERE, **{t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}}
    rows = []
    for rnd in range(args.rounds):
        for name, tree in trees.items():
            res = _in_tree(tree, args.passes)
            rows.append({"round": rnd, "tree": name, **res})
            print(f"round {rnd} {name:<8} " + "  ".join(
                f"{w} {r['first_us']:.0f}/{r['warm_us']:.0f} us" for w, r in res.items()), flush=True)
    summary = {name: {w: {k: statistics.median(r[w][k] for r in rows if r["tree"] == name)
                          for k in ("first_us", "warm_us")} for w in PATHS} for name in trees}
    for name, ws in summary.items():
        print(f"median {name:<8} " + "  ".join(f"{w} first {r['first_us']:.0f} us, warm {r['warm_us']:.0f} us"
                                              for w, r in ws.items()))
    write_tree_comparison(args.out, trees, summary, rows)
    return 0


def write_tree_comparison(path: str, trees: dict[str, Path], summary: dict, rows: list[dict]) -> None:
    """The JSON of a comparison between checkouts: which trees, the medians, every measured row."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "summary": summary, "rows": rows},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
