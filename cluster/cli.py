"""The ``kvmesh`` command line: one sub-command per module in ``kvmesh.cluster.commands``.

Each command module defines ``add_parser(subparsers)``, which registers its parser and sets
``func`` (``args -> int`` exit code) as a default. Modules are imported only when listed
here, and heavy imports (torch, ray) happen inside ``func``, so ``kvmesh --help`` is quick.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under kvmesh.cluster.commands; the order is the order in --help.
COMMANDS = {
    "serve": "serve",
    "replica": "replica",
    "router": "router",
    "status": "status",
    "events": "events",
    "bench": "bench",
    "sim": "sim",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvmesh",
        description="kvmesh: a Ray-distributed LLM serving cluster with a KV-cache-aware router.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        try:
            module = importlib.import_module(f"kvmesh.cluster.commands.{module_name}")
        except ModuleNotFoundError as e:
            if e.name == f"kvmesh.cluster.commands.{module_name}":
                continue  # command not built into this installation
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
