"""``kvmesh drain REPLICA``: stop routing new requests to a replica and let its running ones finish.

Inside ``kvmesh serve`` the replica's process is then removed (the router drops its index) and the
cluster's target replica count of its role is lowered by one (``kvmesh scale N``, ``kvmesh scale --role prefill
N`` restore it; with autoscale.scale_with_load the autoscaler decides again); the cluster's last replica that
decodes is not drained (409: scale up first, or stop the cluster); prefill replicas may all go (the decode
replicas then compute prompts themselves). With a standalone router the replica stays registered, out of
rotation (``DELETE /replicas/{id}`` removes it).

examples:
  kvmesh drain replica-1
  kvmesh drain prefill-2
  kvmesh drain replica-4 --deployment llama   # refused unless replica-4 serves deployment llama
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin
from kvmesh.router.replicas.roles import PREFILL

if TYPE_CHECKING:
    from kvmesh.cluster.router_client import RouterClient


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("drain", help="take a replica out of a running cluster without failing a request",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replica", help="replica id, as `kvmesh status` lists it")
    parser.add_argument("--deployment", default=None,
                        help="refuse unless the replica is this deployment's (a cluster of several models)")
    add_admin_arguments(parser)
    parser.set_defaults(func=run)


def describe(answer: dict) -> str:
    rid, in_flight = answer["id"], answer.get("in_flight", 0)
    text = f"{rid} is draining: no new requests; {in_flight} request(s) in flight finish first"
    if not answer.get("will_be_removed"):
        return text + f". It stays registered, out of rotation (DELETE /replicas/{rid} removes it)"
    target = answer.get("target")
    if target is None:
        return text + "; then its process is removed"
    if rid.startswith(f"{PREFILL}-"):  # serve's prefill replicas (cluster/config/roles.py); target is the others'
        return text + f"; then its process is removed (`kvmesh scale --role {PREFILL} N` starts replacements)"
    return (text + f"; then its process is removed and the cluster's target becomes {target} replica(s) "
            f"(`kvmesh scale {target + 1}` starts a replacement)")


def run(args: argparse.Namespace) -> int:
    def call(client: RouterClient) -> dict:
        if args.deployment is not None:  # the fleet names each replica's deployment
            owner = (client.fleet().get("deployments") or {}).get(args.replica)
            if owner != args.deployment:
                raise ValueError(f"{args.replica} is not a replica of deployment {args.deployment!r}"
                                 + (f" (it serves {owner})" if owner else ""))
        return client.drain(args.replica)

    return run_admin(args, "drain", call, describe, done=lambda state: args.replica not in state["replicas"])
