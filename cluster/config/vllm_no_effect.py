"""``vllm serve`` flags that mean nothing for kvmesh: accepted, with a one-line note at start-up saying so.

A start script written for vLLM often carries flags that only switch off something kvmesh never does
(``--disable-log-requests``) or ask for what kvmesh always does (``--enable-prompt-tokens-details``). They are
taken, by ``kvmesh serve``, ``kvmesh replica`` and ``kvmesh router`` alike, and change nothing. A flag whose value
would ask for behaviour kvmesh lacks (``--guided-decoding-backend outlines``, ``--generation-config auto``) is an
error naming what kvmesh does instead, as are the flags of vllm_forms.py's ``VLLM_ONLY_FLAGS``.
docs/cli.md lists both tables (cluster/cli_reference.py writes them from here).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

NOTES_DEST = "vllm_no_effect_notes"
"""Where the parser collects the notes of the flags given (``no_effect_notes`` reads them; the commands that
accept these flags default it to none)."""


@dataclass(frozen=True, slots=True)
class NoEffect:
    """Why one vLLM flag changes nothing in kvmesh, and which of its values."""

    why: str
    """What kvmesh does that makes the flag moot (the note says it)."""
    takes_value: bool = False
    """vLLM's flag takes a value (else it is a switch)."""
    values: tuple[str, ...] | None = None
    """The values that change nothing (None: any); another is an error."""
    otherwise: str = ""
    """What the error for another value says kvmesh does instead."""


VLLM_NO_EFFECT_FLAGS: dict[str, NoEffect] = {
    "--disable-log-requests": NoEffect("kvmesh logs no request's prompt or parameters"),
    "--no-enable-log-requests": NoEffect("kvmesh logs no request's prompt or parameters"),
    "--disable-log-stats": NoEffect("kvmesh logs no periodic engine statistics (GET /metrics has them)"),
    "--max-log-len": NoEffect("kvmesh logs no prompts", takes_value=True),
    "--enable-prompt-tokens-details": NoEffect("usage.prompt_tokens_details.cached_tokens is always reported"),
    "--enable-server-load-tracking": NoEffect("every replica tracks its load and reports it (GET /load, in kvmesh's "
                                              "shape)"),
    "--disable-uvicorn-access-log": NoEffect("kvmesh's HTTP servers write no access log (the router's --access-log "
                                             "turns one on)"),
    "--uvicorn-log-level": NoEffect(
        "kvmesh sets its own logging: --verbose (serve), --log-level (router)", takes_value=True,
        values=("critical", "error", "warning", "info", "debug", "trace"),
        otherwise="not one of vLLM's levels (critical, error, warning, info, debug, trace)"),
    "--disable-fastapi-docs": NoEffect("kvmesh serves no /docs, /redoc or /openapi.json"),
    "--disable-frontend-multiprocessing": NoEffect("a replica's HTTP server runs in its engine's process"),
    "--guided-decoding-backend": NoEffect(
        "structured outputs always use xgrammar", takes_value=True, values=("xgrammar", "auto"),
        otherwise="kvmesh's structured outputs use xgrammar only: give xgrammar or auto, or leave the flag out"),
    "--generation-config": NoEffect(
        "kvmesh's default sampling parameters are vLLM's own (the model's generation_config.json gives only its "
        "end-of-sequence ids)", takes_value=True, values=("vllm",),
        otherwise="kvmesh takes no default sampling parameters from a generation config: requests set their own "
                  "(temperature, top_p, ...); give vllm or leave the flag out"),
}
"""``vllm serve`` flags accepted with no effect -> why (the start-up note says it)."""


class _NoEffectFlag(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        self.no_effect = VLLM_NO_EFFECT_FLAGS[option_strings[0]]
        super().__init__(option_strings, NOTES_DEST, nargs=None if self.no_effect.takes_value else 0,
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS, metavar="VALUE", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        allowed = self.no_effect.values
        if allowed is not None and values not in allowed:
            parser.error(f"{option_string} {values}: {self.no_effect.otherwise}")
        namespace.vllm_no_effect_notes = [*namespace.vllm_no_effect_notes,
                                          f"{option_string} has no effect in kvmesh: {self.no_effect.why}"]


def accept_no_effect_flags(parser: argparse.ArgumentParser) -> None:
    """Make each of ``VLLM_NO_EFFECT_FLAGS`` the parser does not define a flag that only leaves a note."""
    taken = set(parser._option_string_actions)  # noqa: SLF001 (argparse keeps no public list of its flags)
    parser.set_defaults(vllm_no_effect_notes=())
    for flag in VLLM_NO_EFFECT_FLAGS:
        if flag not in taken:
            parser.add_argument(flag, action=_NoEffectFlag)


def no_effect_notes(args: argparse.Namespace) -> Sequence[str]:
    """One line per vLLM flag given that changes nothing, for the command to print at start-up."""
    return args.vllm_no_effect_notes


def print_no_effect_notes(args: argparse.Namespace, command: str) -> None:
    """The notes on stderr, one line each (``kvmesh COMMAND: --flag has no effect in kvmesh: why``)."""
    for note in no_effect_notes(args):
        print(f"kvmesh {command}: {note}", file=sys.stderr, flush=True)
