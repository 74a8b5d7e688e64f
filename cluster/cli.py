"""The ``kvmesh`` command line: one sub-command per module in ``kvmesh.cluster.commands``.

Each command module defines ``add_parser(subparsers)``, which registers its parser and sets
``func`` (``args -> int`` exit code) as a default. Command modules import only the config
dataclasses (torch-free); heavy imports (torch, ray) happen inside ``func``, so ``kvmesh --help``
and ``kvmesh router`` work on an install without the engine extra.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys

# name -> module under kvmesh.cluster.commands; the order is the order in --help.
COMMANDS = {
    "serve": "serve",
    "replica": "replica",
    "router": "router",
    "status": "status",
    "scale": "scale",
    "drain": "drain",
    "rollout": "rollout",
    "events": "events",
    "bench": "bench",
    "sim": "sim",
}


# Modules of the optional extras (pyproject.toml) -> the extra that brings them.
EXTRA_OF = {"torch": "engine", "ray": "engine", "safetensors": "engine", "psutil": "engine", "transformers": "hf",
            "jinja2": "hf",
            "matplotlib": "plots", "flash_attn": "gpu"}


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a did-you-mean for mistyped flags (``--blok-size`` -> ``--block-size``)."""

    def error(self, message: str):
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [f for p in _parsers(self) for f in p._option_string_actions]
            hints = []
            for arg in unknown.group(1).split():
                name = arg.split("=", 1)[0]
                close = difflib.get_close_matches(name, flags, n=1, cutoff=0.7) if name.startswith("-") else []
                if close:
                    hints.append(f"{name} (did you mean {close[0]}?)")
            if hints:
                message += "; " + "; ".join(hints)
        super().error(message)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and, for the sub-command given on this command line, its parser (recursively)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = [p for name, p in action.choices.items() if name in _ARGV]
            for sub in chosen:
                found += _parsers(sub)
    return found


_ARGV: list[str] = []


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kvmesh")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="kvmesh",
        description="kvmesh: a Ray-distributed LLM serving cluster with a KV-cache-aware router.",
    )
    parser.add_argument("--version", action="version", version=f"kvmesh {version()}")
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


# ``kvmesh sim <mode> ...``: simulations with a command line of their own (besides the policy comparison).
SIM_MODES = {"scaling": "kvmesh.cluster.sim.scaling"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "sim" and argv[1] in SIM_MODES:
        return int(importlib.import_module(SIM_MODES[argv[1]]).main(argv[2:]) or 0)
    parser = build_parser()
    _ARGV[:] = argv
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # a command that needs an extra this install does not have
        top = (e.name or "").split(".")[0]
        extra = EXTRA_OF.get(top)
        if extra is None:
            raise
        print(f"kvmesh {args.command}: needs the Python package {top!r}, which this install lacks; "
              f"pip install 'kvmesh[{extra}]'", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
