"""``vllm serve`` flags on kvmesh's command lines: each row of vllm_flags.py's table made an argparse action.

``accept_vllm_flags(parser)`` gives ``kvmesh serve``, ``kvmesh replica`` and ``kvmesh router`` every flag of the
table they do not define themselves: a ``Mapped`` one sets kvmesh's flag, a ``NoEffect`` one only leaves a note,
a ``Refused`` one (and a ``Same`` or ``Mapped`` one whose kvmesh flag this command lacks) is an error saying what
to do instead, never argparse's bare "unrecognized arguments". The notes are printed once at start-up
(``print_vllm_notes``); a ``Same`` flag that changes nothing on CPU is noted once the device is known
(``cpu_notes``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvmesh.cluster.config.vllm_flags import VLLM_SERVE_FLAGS, Mapped, NoEffect, Refused, Same

NOTES_DEST = "vllm_no_effect_notes"
"""Where the parser collects the notes of the flags given (``no_effect_notes`` reads them)."""
ON_CPU_DEST = "vllm_on_cpu"
"""dest -> note of the given flags that change nothing on CPU (``cpu_notes`` reads it)."""

VLLM_NO_EFFECT_FLAGS: dict[str, NoEffect] = {f: t for f, t in VLLM_SERVE_FLAGS.items() if isinstance(t, NoEffect)}
"""``vllm serve`` flags accepted with no effect -> why (the start-up note says it)."""
VLLM_ONLY_FLAGS: dict[str, str] = {f: t.instead for f, t in VLLM_SERVE_FLAGS.items() if isinstance(t, Refused)}
"""``vllm serve`` flags kvmesh does not take -> what kvmesh does instead (the error says it)."""


def _note(namespace: argparse.Namespace, text: str) -> None:
    namespace.vllm_no_effect_notes = [*namespace.vllm_no_effect_notes, text]


class _RefusedFlag(argparse.Action):
    def __init__(self, option_strings, dest, instead: str, **kwargs):
        self.instead = instead
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a vLLM flag kvmesh does not take; {self.instead}")


class _NoEffectFlag(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        self.no_effect = VLLM_NO_EFFECT_FLAGS[option_strings[0]]
        super().__init__(option_strings, NOTES_DEST, nargs=None if self.no_effect.takes_value else 0,
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS, metavar="VALUE", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        allowed = self.no_effect.values
        if allowed is not None and values not in allowed:
            parser.error(f"{option_string} {values}: {self.no_effect.otherwise}")
        _note(namespace, f"{option_string} has no effect in kvmesh: {self.no_effect.why}")


class _MappedFlag(argparse.Action):
    """Runs kvmesh's own action for ``mapped.to`` with the value converted."""

    def __init__(self, option_strings, dest, mapped: Mapped, target: argparse.Action, **kwargs):
        self.mapped, self.target = mapped, target
        nargs = 0 if mapped.example is None else None
        super().__init__(option_strings, f"vllm_mapped_{dest}", nargs=nargs, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS, metavar="VALUE", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        mapped = self.mapped
        if mapped.example is None:  # a switch
            values = None
        elif mapped.value is not None:
            values = mapped.value(values)
        self.target(parser, namespace, values, mapped.to)
        if not mapped.spelling:
            given = "" if mapped.example is None else f" {values}"
            _note(namespace, f"{option_string} is taken as kvmesh's {mapped.to}{given}")


def accept_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` each flag of the table it does not define, as the table says."""
    own = dict(parser._option_string_actions)  # noqa: SLF001 (argparse keeps no public list of its flags)
    parser.set_defaults(**{NOTES_DEST: (), ON_CPU_DEST: {}})
    command = parser.prog.removeprefix("kvmesh ")
    for flag, treatment in VLLM_SERVE_FLAGS.items():
        if isinstance(treatment, Same) and flag in own and treatment.on_cpu:
            parser.set_defaults(**{ON_CPU_DEST: {**parser.get_default(ON_CPU_DEST), own[flag].dest:
                                                 f"{flag} has no effect: {treatment.on_cpu}"}})
        if flag in own:
            continue
        dest = f"vllm_{flag.lstrip('-').replace('-', '_')}"
        if isinstance(treatment, NoEffect):
            parser.add_argument(flag, action=_NoEffectFlag)
        elif isinstance(treatment, Mapped) and treatment.to in own:
            parser.add_argument(flag, dest=dest, action=_MappedFlag, mapped=treatment, target=own[treatment.to])
        else:
            parser.add_argument(flag, dest=dest, action=_RefusedFlag, instead=_instead(treatment, command))


def _instead(treatment: Same | Mapped | Refused, command: str) -> str:
    if isinstance(treatment, Refused):
        return treatment.instead
    if isinstance(treatment, Mapped):
        return f"it is kvmesh's {treatment.to}, which `kvmesh {command}` does not take (`kvmesh serve` does)"
    return f"`kvmesh {command}` does not take it (`kvmesh serve` does)"


def no_effect_notes(args: argparse.Namespace) -> Sequence[str]:
    """One line per vLLM flag given that changes nothing or is taken as another, for the command to print."""
    return args.vllm_no_effect_notes


def cpu_notes(args: argparse.Namespace) -> list[str]:
    """One line per flag given that changes nothing when the replicas run on CPU."""
    return [note for dest, note in args.vllm_on_cpu.items() if hasattr(args, dest)]


def print_vllm_notes(args: argparse.Namespace, command: str) -> None:
    """The notes on stderr, one line each (``kvmesh COMMAND: --flag has no effect in kvmesh: why``)."""
    for note in no_effect_notes(args):
        print(f"kvmesh {command}: {note}", file=sys.stderr, flush=True)
