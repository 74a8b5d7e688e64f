"""``kvmesh bench engine-speed``: flags derived from ``EngineSpeedOptions`` (name, type, default, doc line)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from kvmesh.cluster.config.schema import field_docs
from kvmesh.cluster.measure.benchmarks.engine_speed.options import EngineSpeedOptions

PROG = "kvmesh bench engine-speed"
DESCRIPTION = ("Engine speed on one device: throughput of a burst of requests, decode ms/step at several "
               "batch sizes, TTFT cold vs prefix-cached, HF generate and the weight-read floor, "
               "for the default engine configuration and each --configs entry.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    hints, docs = typing.get_type_hints(EngineSpeedOptions), field_docs(EngineSpeedOptions)
    for f in dataclasses.fields(EngineSpeedOptions):
        flag, doc = "--" + f.name.replace("_", "-"), docs.get(f.name, "")
        if hints[f.name] is bool:
            parser.add_argument(flag, action="store_true", help=doc)
            continue
        kind = next((t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None)), str)
        parser.add_argument(flag, type=kind, default=f.default, metavar=f.name.upper(),
                            help=f"{doc} (default: {f.default})")
    return parser


def parse_options(argv: list[str] | None) -> EngineSpeedOptions:
    """The options of ``argv``; a bad value exits 2 with the reason (argparse's way), not a traceback."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return EngineSpeedOptions(**vars(ns))
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    from kvmesh.cluster.measure.benchmarks.engine_speed.run import run

    try:
        run(options)
    except ValueError as e:  # a setting this machine or model cannot satisfy (no CUDA, prompt too long, ...)
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0
