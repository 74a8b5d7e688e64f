"""``--help`` in a page: the flags most runs need, grouped by what they are for; the rest on request.

``kvmesh serve`` has some 250 flags, one per config field. As ``vllm serve --help`` does, ``--help`` answers with
the common ones and the sections, and ``--help=VALUE`` with the rest:

    --help          the common flags by task, then the sections and how to ask for them
    --help=all      every flag (argparse's whole help)
    --help=SECTION  one section (engine, replicas, router, ...: the config tree's, ``options`` for the command's own)
    --help=WORD     every flag whose name has WORD in it (``--help=lora``)
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap

Common = dict[str, list[str]]
"""Heading (what the flags are for) -> the flags under it, in the order shown."""
ALL = "all"


class GroupedHelp(argparse._HelpAction):  # a help action still (cli_reference.py skips it), with a value
    """``-h``/``--help`` with an optional ``=all``, ``=SECTION`` or ``=WORD``."""

    def __init__(self, option_strings, common: Common, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        argparse.Action.__init__(self, option_strings=option_strings, dest=dest, default=default, nargs="?",
                                 metavar="all|SECTION|WORD", help=help)
        self.common = common

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            parser._print_message(short_help(parser, self.common), sys.stdout)  # noqa: SLF001
            parser.exit()
        text = topic_help(parser, values)
        if text is None:
            parser.error(f"--help={values}: no section or flag matches; sections: {', '.join(sections(parser))} "
                         "(--help=all lists every flag)")
        parser._print_message(text, sys.stdout)  # noqa: SLF001
        parser.exit()


def add_grouped_help(parser: argparse.ArgumentParser, common: Common) -> None:
    """Give ``parser`` (made with ``add_help=False``) the grouped ``-h/--help``."""
    parser.add_argument("-h", "--help", action=GroupedHelp, common=common,
                        help="the common flags; --help=all every flag, --help=SECTION one section, --help=WORD the "
                             "flags whose name has WORD")


def sections(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """Section name -> its group: a config section's name (``engine``), ``options`` for the command's own."""
    found = {}
    for group in parser._action_groups:  # noqa: SLF001 (argparse keeps no public list of its groups)
        if group._group_actions and group.title != "positional arguments":  # noqa: SLF001
            found[group.title.split(" ")[0]] = group
    return found


def short_help(parser: argparse.ArgumentParser, common: Common) -> str:
    """Usage, the command's description, the common flags by task, and how to see the others."""
    actions = {name: action for action in parser._actions for name in action.option_strings}  # noqa: SLF001
    formatter = parser._get_formatter()  # noqa: SLF001
    formatter.add_usage(f"{parser.prog} [MODEL] [options]" if _has_model(parser) else f"{parser.prog} [options]",
                        [], [])
    formatter.add_text(parser.description)
    for heading, flags in common.items():
        formatter.start_section(heading)
        formatter.add_arguments([_positional(parser) if flag == "MODEL" else actions[flag] for flag in flags])
        formatter.end_section()
    counts = ", ".join(f"{name} ({len(_shown(group._group_actions))})"  # noqa: SLF001
                       for name, group in sections(parser).items())
    formatter.start_section("every other flag")
    wrapped = textwrap.fill(counts, width=90, initial_indent=" " * 17, subsequent_indent=" " * 17)
    formatter.add_text(f"--help=all       all {len(_shown(parser._actions))} flags\n"  # noqa: SLF001
                       f"--help=SECTION   one section:\n{wrapped}\n"
                       "--help=WORD      the flags whose name has WORD (--help=kv)\n"
                       "docs/cli.md      every flag, and what kvmesh does with each `vllm serve` flag")
    formatter.end_section()
    return formatter.format_help()


def topic_help(parser: argparse.ArgumentParser, topic: str) -> str | None:
    """``--help=TOPIC``: every flag, one section, or the flags whose name has the word; None: nothing matches."""
    word = topic.strip().lower().lstrip("-").replace("_", "-")
    if word == ALL:
        return parser.format_help()
    formatter = parser._get_formatter()  # noqa: SLF001
    group = sections(parser).get(word)
    if group is not None:
        formatter.start_section(group.title)
        formatter.add_text(group.description)
        formatter.add_arguments(group._group_actions)  # noqa: SLF001
        formatter.end_section()
        return formatter.format_help()
    matched = [action for action in _shown(parser._actions)  # noqa: SLF001
               if any(word in re.sub(r"^-+", "", name) for name in action.option_strings)]
    if not matched:
        return None
    formatter.start_section(f"flags matching {word!r}")
    formatter.add_arguments(matched)
    formatter.end_section()
    return formatter.format_help()


def _shown(actions: list[argparse.Action]) -> list[argparse.Action]:
    """The flags help lists (not vLLM's spellings that only note or refuse)."""
    return [action for action in actions if action.option_strings and action.help != argparse.SUPPRESS]


def _has_model(parser: argparse.ArgumentParser) -> bool:
    return _positional(parser) is not None


def _positional(parser: argparse.ArgumentParser) -> argparse.Action | None:
    return next((action for action in parser._actions if action.metavar == "MODEL"), None)  # noqa: SLF001
