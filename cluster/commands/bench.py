"""``kvmesh bench``: the HTTP load generator, the policy comparison driver, and component benchmarks.

    kvmesh bench load --url http://127.0.0.1:8000 --workload chatbot ...
    kvmesh bench compare-policies --policies cache_aware,round_robin ...
    kvmesh bench <area> [args]      -> kvmesh.cluster.measure.benchmarks.<area>.main(args)
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

TOOLS = {
    "load": "load-test an OpenAI endpoint (router, replica, any server)",
    "compare-policies": "run one workload through the router under several policies, side by side",
}
SUPPORT = "support"
"""benchmarks/support/: what the areas share (fake replicas, HTTP drivers, peers); the one room that is no area."""


def available_areas() -> list[str]:
    """The modules at the top of kvmesh.cluster.measure.benchmarks, each an area (found without importing them)."""
    try:
        pkg = importlib.import_module("kvmesh.cluster.measure.benchmarks")
    except ModuleNotFoundError:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name != SUPPORT)


def _description() -> str:
    lines = ["Benchmarks. Targets:", ""]
    lines += [f"  {name:<18} {doc}" for name, doc in TOOLS.items()]
    areas = available_areas()
    lines += ["", "Component benchmarks (kvmesh.cluster.measure.benchmarks.<area>, results/<area>.json):"]
    lines += [f"  {a}" for a in areas] or ["  (none installed)"]
    lines += ["", "Run `kvmesh bench TARGET --help` for a target's options."]
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="load generator, policy comparison, component benchmarks",
                              description=_description(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="load, compare-policies, or a component area (see above)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the target's own arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    target, rest = args.target, list(args.args)
    if target == "load":
        from kvmesh.cluster.measure.loadgen.load import main

        return main(rest)
    if target == "compare-policies":
        from kvmesh.cluster.measure.loadgen.compare import main

        return main(rest)
    areas = available_areas()
    target = target.replace("-", "_") if target.replace("-", "_") in areas else target  # router-peers
    if target not in areas:
        print(f"kvmesh bench: unknown target {target!r}; choose one of "
              f"{', '.join([*TOOLS, *areas])}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"kvmesh.cluster.measure.benchmarks.{target}")
    return int(module.main(rest) or 0)
