"""``kvmesh serve --help`` is a page: the common flags grouped by what users do, then how to see the rest
(``--help=all``, ``--help=SECTION``, ``--help=WORD``, as ``vllm serve --help=...`` does); replica and router too."""

from __future__ import annotations

import importlib
import re

import pytest
from kvmesh.cluster.cli import main

COMMANDS = ["serve", "replica", "router"]
SHORT_LINES = 150


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    assert exit_.value.code == 0 and out.err == "", out.err
    return out.out


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_a_page_of_the_common_flags_by_task(command, capsys):
    text = help_of([command, "--help"], capsys)
    common = importlib.import_module(f"kvmesh.cluster.commands.{command}").COMMON_FLAGS
    assert len(text.splitlines()) < SHORT_LINES
    for heading, flags in common.items():
        assert f"\n{heading}:\n" in text
        assert all(flag in text for flag in flags), heading
    assert "--help=all" in text and "--help=SECTION" in text


def test_serve_help_leaves_the_rare_flags_out(capsys):
    text = help_of(["serve", "-h"], capsys)
    assert "--events-max-pending-bytes" not in text and "--admission-shared-tenant" not in text


@pytest.mark.parametrize("command", COMMANDS)
def test_help_all_lists_every_flag(command, capsys):
    from kvmesh.cluster.cli import build_parser

    parser = build_parser()._subparsers._group_actions[0].choices[command]  # noqa: SLF001
    text = help_of([command, "--help=all"], capsys)
    assert text == parser.format_help()
    shown = [action.option_strings[0] for action in parser._actions  # noqa: SLF001
             if action.option_strings and action.help != "==SUPPRESS=="]
    assert all(flag in text for flag in shown)


def test_a_section_lists_its_flags_only(capsys):
    text = help_of(["serve", "--help=engine"], capsys)
    assert "--block-size" in text and "--max-num-seqs" in text and "--policy " not in text


def test_a_word_lists_the_flags_whose_name_has_it(capsys):
    text = help_of(["serve", "--help=lora"], capsys)
    assert {"--enable-lora", "--max-loras", "--max-lora-rank", "--lora-modules"} <= set(re.findall(r"--[a-z-]+", text))
    assert "--block-size" not in text


def test_a_topic_nothing_matches_is_a_one_line_error_naming_the_sections(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help=zzz"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--help=zzz: no section or flag matches; sections: options, engine" in err
