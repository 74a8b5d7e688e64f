"""``kvmesh drain REPLICA``: stop routing new requests to a replica and let its running ones finish.

Inside ``kvmesh serve`` the replica's process is then removed (the router drops its index); with
a standalone router the replica stays registered, out of rotation (``DELETE /replicas/{id}``
removes it).

examples:
  kvmesh drain replica-1
"""

from __future__ import annotations

import argparse

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("drain", help="take a replica out of a running cluster without failing a request",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("replica", help="replica id, as `kvmesh status` lists it")
    add_admin_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_admin(args, "drain", lambda client: client.drain(args.replica),
                     done=lambda state: args.replica not in state["replicas"])
