"""``kvmesh scale N``: run N replicas (new ones through the same placement groups; extra ones drained first).

examples:
  kvmesh scale 3                  # the one cluster running here (several: add --url)
  kvmesh scale 1 --url http://10.0.0.5:8000 --wait 0
"""

from __future__ import annotations

import argparse

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scale", help="change a running cluster's replica count", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replicas", type=int, help="replicas wanted")
    add_admin_arguments(parser)
    parser.set_defaults(func=run)


def describe(wanted: int, answer: dict) -> str:
    now = answer.get("replicas", [])
    return f"scaling to {wanted} replica(s) (now {len(now)}: {', '.join(now) or 'none'})"


def run(args: argparse.Namespace) -> int:
    return run_admin(args, "scale", lambda client: client.scale(args.replicas),
                     lambda answer: describe(args.replicas, answer),
                     done=lambda state: len(state["replicas"]) == args.replicas)
