"""``kvmesh rollout``: restart every replica, one at a time, without failing a request.

For each replica: start a new one (with the --engine changes), wait until the router routes to it
(the health gate), then drain the old one and remove it. Capacity never drops below the count.

examples:
  kvmesh rollout
  kvmesh rollout --engine max_num_seqs=64 --engine max_num_batched_tokens=4096
  kvmesh rollout --deployment llama --engine max_num_seqs=64   # one deployment's replicas (several models)
"""

from __future__ import annotations

import argparse
import json
import sys

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rollout", help="rolling restart of a running cluster's replicas",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", action="append", default=[], metavar="FIELD=VALUE",
                        help="an engine setting the new replicas get (repeatable; JSON values, else text)")
    parser.add_argument("--deployment", default=None,
                        help="restart only this deployment's replicas (a cluster of several models)")
    add_admin_arguments(parser)
    parser.set_defaults(func=run)


def parse_settings(items: list[str]) -> dict:
    settings = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field:
            raise ValueError(f"--engine {item!r}: expected FIELD=VALUE, e.g. --engine max_num_seqs=64")
        try:
            settings[field] = json.loads(value)
        except json.JSONDecodeError:
            settings[field] = value
    return settings


def describe(answer: dict) -> str:
    old = answer.get("replicas", [])
    changes = answer.get("engine_changes") or []
    return (f"restarting {len(old)} replica(s) one at a time ({', '.join(old)}); each new one gets a new name"
            + (f" and the new {', '.join(changes)}" if changes else " and the same engine settings"))


def run(args: argparse.Namespace) -> int:
    try:
        engine = parse_settings(args.engine)
    except ValueError as e:
        print(f"kvmesh rollout: {e}", file=sys.stderr)
        return 2
    operation = "rollout" if args.deployment is None else f"rollout {args.deployment}"
    return run_admin(args, "rollout", lambda client: client.rollout(engine, args.deployment), describe,
                     done=lambda state: bool(state["operations"]) and state["operations"][-1]["operation"] == operation)
