"""docs/cli.md is what the argument parsers generate: a flag added, renamed or re-documented in the code and
not in the reference fails here, and so does a flag the reference names that no parser has."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kvmesh.cluster.cli import build_parser
from kvmesh.cluster.cli_reference import markdown

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGENERATE = "regenerate: .venv/bin/python -m kvmesh.cluster.cli_reference > docs/cli.md"


def test_cli_reference_is_the_generated_one():
    assert CLI_DOC.read_text() == markdown(), REGENERATE


def test_every_serve_flag_is_in_the_reference():
    text = CLI_DOC.read_text()
    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]
    flags = {next(name for name in action.option_strings if name.startswith("--"))
             for action in serve._actions if action.option_strings and action.help != argparse.SUPPRESS}
    documented = set(re.findall(r"`(--[a-z0-9-]+)`", text.split("## `kvmesh replica`")[0]))
    assert flags - {"--help"} <= documented, sorted(flags - documented)


def test_a_flag_added_to_a_parser_changes_the_reference(monkeypatch):
    def with_new_flag():
        parser = build_parser()
        serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
        serve.add_argument("--brand-new-flag", help="a flag the shipped reference has never seen")
        return parser

    monkeypatch.setattr("kvmesh.cluster.cli_reference.build_parser", with_new_flag)
    assert "`--brand-new-flag`" in markdown() and markdown() != CLI_DOC.read_text()
