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
    "lora": "lora",
    "events": "events",
    "bench": "bench",
    "sim": "sim",
}


# Modules of the optional extras (pyproject.toml) -> the extra that brings them.
EXTRA_OF = {"torch": "engine", "ray": "engine", "safetensors": "engine", "psutil": "engine", "transformers": "hf",
            "jinja2": "hf",
            "matplotlib": "plots", "flash_attn": "gpu"}


class ArgumentParser(argparse.ArgumentParser):
    """argparse without prefix matching (``--num-replica`` is an error, not ``--num-replicas``), with a
    did-you-mean for mistyped flags and commands, and each sub-command's mistakes reported with that
    sub-command's usage."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "kvmesh":  # a sub-command's own flags: its usage, not the top-level one
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            hints = [hint for arg in unknown.group(1).split() if (hint := self._flag_hint(arg))]
            if hints:
                message += "; " + "; ".join(hints)
            elif self.prog != "kvmesh":
                message += f"; `{self.prog} --help=all` lists every flag"
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            close = difflib.get_close_matches(choice.group(2), re.findall(r"'([^']*)'", choice.group(3)), n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        usage = self.format_usage()
        if usage.count("\n") > 4:  # serve's is a page of flags: point at --help instead
            usage = f"usage: {self.prog} [options]  (`{self.prog} --help` lists them)\n"
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")

    def _flag_hint(self, arg: str) -> str | None:
        name = arg.split("=", 1)[0]
        if not name.startswith("-"):
            return None
        close = close_flag(name, list(self._option_string_actions))
        if close:
            return f"{name} (did you mean {close}?)"
        if self.prog != "kvmesh":
            return None
        # the top level: options belong after a command; name the commands that have this one (or one like it)
        owners = {}
        for command, sub in _subcommands(self).items():
            match = close_flag(name, list(sub._option_string_actions))
            if match:
                owners[command] = match
        if not owners:
            return f"{name} is no option of any command; `kvmesh COMMAND --help` lists a command's options"
        return f"{name}: options go after the command, did you mean " + " or ".join(
            f"`kvmesh {command} {flag}`" for command, flag in owners.items()) + "?"


MAX_TYPO_EDITS = 2
"""A did-you-mean names a flag at most this many single-character edits from the one typed (a typo), never one
that merely shares words with it (``--ssl-keyfile`` is no ``--admission-keys-file``)."""


def close_flag(name: str, flags: list[str]) -> str | None:
    """The one flag a typo of ``name`` would be (fewest edits, at most ``MAX_TYPO_EDITS``), else None."""
    best = min(flags, key=lambda flag: _edits(name, flag), default=None)
    return best if best is not None and _edits(name, best) <= MAX_TYPO_EDITS else None


def _edits(a: str, b: str) -> int:
    """Levenshtein distance, a swap of two neighbours counting one (optimal string alignment)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb)))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


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
SIM_MODES = {"scaling": "kvmesh.cluster.measure.sim.scaling"}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # Ctrl-C at any point, imports included: an exit, not a traceback
        return 130
    except BrokenPipeError:  # `kvmesh status --json | head`: the reader left, as it may
        return _reader_left()


def _reader_left() -> int:
    """Exit as a process killed by SIGPIPE reports it (128 + 13), without the traceback: what is still
    buffered for stdout goes to /dev/null, so the interpreter's last flush cannot fail again."""
    import os
    import signal

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (a test's capture)
        pass
    return 128 + signal.SIGPIPE


def _main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "sim" and argv[1] in SIM_MODES:
        return int(importlib.import_module(SIM_MODES[argv[1]]).main(argv[2:]) or 0)
    parser = build_parser()
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        parser.error(f"unrecognized arguments: {argv[0]}")  # before argparse takes its value for the command
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as e:  # a command that needs an extra this install does not have
        top = (e.name or "").split(".")[0]
        extra = EXTRA_OF.get(top)
        if extra is None:
            raise
        print(f"kvmesh {args.command}: needs the Python package {top!r}, which this install lacks; "
              f"install kvmesh with its {extra} extra (pip install '.[{extra}]' in kvmesh's source tree)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
