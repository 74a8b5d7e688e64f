"""``kvmesh scale N``: run N replicas (new ones through the same placement groups; extra ones drained first).

--role prefill scales the prefill replicas (0 ends the prefill/decode split); without it, the replicas that
serve requests (role decode, or both in a cluster without prefill replicas) are scaled.

examples:
  kvmesh scale 3                  # the one cluster running here (several: add --url)
  kvmesh scale --role prefill 2   # two prefill replicas
  kvmesh scale 1 --url http://10.0.0.5:8000 --wait 0
  kvmesh scale 3 --deployment llama   # a cluster of several models (serve's deployments): that one's replicas
"""

from __future__ import annotations

import argparse

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin
from kvmesh.router.replicas.roles import PREFILL, ROLES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("scale", help="change a running cluster's replica count", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replicas", type=int, help="replicas wanted (of --role)")
    parser.add_argument("--role", choices=ROLES, default=None,
                        help="which replicas: prefill, or decode/both = the ones that serve requests (the default)")
    parser.add_argument("--deployment", default=None,
                        help="the deployment whose replicas to scale (a cluster of several models)")
    add_admin_arguments(parser)
    parser.set_defaults(func=run)


def describe(wanted: int, answer: dict) -> str:
    now, what = answer.get("replicas", []), "prefill replica(s)" if answer.get("role") == PREFILL else "replica(s)"
    if answer.get("deployment"):
        what += f" of {answer['deployment']}"
    return f"scaling to {wanted} {what} (now {len(now)} in all: {', '.join(now) or 'none'})"


def count(state: dict, role: str | None) -> int:
    """Replicas of ``role`` (None, decode, both: those that serve requests) in ``GET /admin/fleet``'s state."""
    roles = state.get("roles") or {}
    return sum((roles.get(r, "both") == PREFILL) == (role == PREFILL) for r in state["replicas"])


def run(args: argparse.Namespace) -> int:
    def done(state: dict) -> bool:
        if args.deployment is None:
            return count(state, args.role) == args.replicas
        return list((state.get("deployments") or {}).values()).count(args.deployment) == args.replicas

    return run_admin(args, "scale", lambda client: client.scale(args.replicas, args.role, args.deployment),
                     lambda answer: describe(args.replicas, answer), done=done)
