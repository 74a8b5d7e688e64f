"""The CLI reference (docs/cli.md), generated from the argument parsers themselves: every command and
sub-command of ``kvmesh``, each flag with its value, default and help. Flags that set a key of
``kvmesh serve``'s config tree are listed by section and point at the configuration reference
(docs/configuration.md, generated from the config dataclasses), so each doc line lives in one place.
tests/cluster/test_cli_docs.py compares the shipped file with this output.

    python -m kvmesh.cluster.cli_reference > docs/cli.md
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.config.trees import SERVE_SCHEMA

HEADER = """# CLI reference

Generated from the argument parsers (`python -m kvmesh.cluster.cli_reference > docs/cli.md`; a test keeps it
so). Every command also answers `--help`; `kvmesh serve`, `replica` and `router` list there the flags most runs
need, grouped by task, and answer `--help=all` (every flag), `--help=SECTION` (one section: `engine`, `router`,
...) and `--help=WORD` (the flags whose name has WORD), as `vllm serve --help=...` does. Flags that set a key of
the config tree are listed by section: each one's meaning, default and environment variable are in the
[configuration reference](configuration.md), and the same key is read from `--config FILE` and from
`KVMESH_<SECTION>_<FIELD>`.
"""

NESTED = {"bench load": "kvmesh.cluster.measure.loadgen.load",
          "bench compare-policies": "kvmesh.cluster.measure.loadgen.compare"}
"""Sub-commands that parse their own arguments (``kvmesh bench TARGET ARGS...``): module -> ``build_parser()``."""

CONFIG_REFERENCE = "configuration.md#kvmesh-serve-every-option"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flag_names(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{name}`" for name in action.option_strings)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:
        return ""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    return f"`{metavar}`" + (" ..." if action.nargs in ("+", "*", argparse.REMAINDER) else "")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    # a default under the home directory (~/.cache/kvmesh/...) is written as ~: the page is the same for everyone
    return _cell(parser._get_formatter()._expand_help(action).replace(str(Path.home()), "~"))


def _serve_keys() -> set[str]:
    return {"cfg__" + opt.dotted.replace(".", "__") for opt in SERVE_SCHEMA.options}


def _command(name: str, parser: argparse.ArgumentParser, serve_keys: set[str]) -> list[str]:
    lines = [f"## `kvmesh {name}`", ""]
    if parser.description:
        lines += [_cell(parser.description.split("\n\n")[0]), ""]
    rows, by_section = [], {}
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                       argparse._SubParsersAction)):
                continue
            if action.dest in serve_keys:
                by_section.setdefault(group.title.split(" ")[0], []).extend(action.option_strings[:1])
                continue
            rows.append(f"| {_flag_names(action)} | {_value(action)} | {_help(parser, action)} |")
    if rows:
        lines += ["| argument | value | meaning |", "|---|---|---|", *rows, ""]
    for section, flags in by_section.items():
        listed = ", ".join(f"`{flag}`" for flag in flags)
        lines += [f"Config section `{section}` ([reference]({CONFIG_REFERENCE})): {listed}.", ""]
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _vllm_flags() -> list[str]:
    """Every row of the ``vllm serve`` flag table (cluster/config/vllm_flags.py) and what kvmesh does with it."""
    from kvmesh.cluster.config.vllm_flags import VLLM_SERVE_FLAGS

    lines = ["## vLLM's flags", "", "What `kvmesh serve` does with each flag a `vllm serve` command commonly carries "
             "(`kvmesh replica` and `kvmesh router` too, where they take the setting). *same*: kvmesh's flag of that "
             "name, with vLLM's meaning; *taken as*: set as kvmesh's flag of another name, said in one line at "
             "start-up; *noted*: accepted, changing nothing, said in one line at start-up; *refused*: an error "
             "saying what to do instead.", "", "| `vllm serve` flag | in kvmesh |", "|---|---|"]
    lines += [f"| `{flag}` | {_cell(_treatment(treatment))} |" for flag, treatment in VLLM_SERVE_FLAGS.items()]
    return lines + [""]


def _treatment(treatment) -> str:
    from kvmesh.cluster.config.vllm_flags import Mapped, NoEffect, Same

    if isinstance(treatment, Same):
        extra = "; ".join(text for text in (treatment.remark, treatment.on_cpu and "noted on CPU: " + treatment.on_cpu)
                          if text)
        return "same" + (f" ({extra})" if extra else "")
    if isinstance(treatment, Mapped):
        return f"taken as `{treatment.to}`" + (f" ({treatment.remark})" if treatment.remark else "")
    if isinstance(treatment, NoEffect):
        values = "" if treatment.values is None else " with " + " or ".join(f"`{v}`" for v in treatment.values)
        other = "" if treatment.values is None else f"; another value is refused: {treatment.otherwise}"
        return f"noted{values}: {treatment.why}{other}"
    return f"refused: {treatment.instead}"


def markdown() -> str:
    """docs/cli.md: every command of ``kvmesh`` in the order ``kvmesh --help`` lists them, then vLLM's flags."""
    serve_keys, lines = _serve_keys(), [HEADER]
    for name, parser in _subcommands(build_parser()).items():
        lines += _command(name, parser, serve_keys)
        for sub, sub_parser in _subcommands(parser).items():
            lines += _command(f"{name} {sub}", sub_parser, serve_keys)
        for nested, module in NESTED.items():
            if nested.split(" ")[0] == name:
                lines += _command(nested, importlib.import_module(module).build_parser(), serve_keys)
    lines += _vllm_flags()
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
