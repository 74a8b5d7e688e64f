"""``kvmesh lora load NAME PATH``: add a LoRA adapter to a running fleet; ``kvmesh lora unload NAME``: remove it.

The router loads the adapter (a PEFT directory: adapter_config.json + safetensors, a path its replicas can read) on
every healthy replica of its base model and routes ``"model": NAME`` to them from then on (vLLM's
``/v1/load_lora_adapter``, with the admin key). ``--deployment D`` names the base model (a deployment's served
name) when the router serves several.

examples:
  kvmesh lora load sql-expert /models/adapters/sql-expert
  kvmesh lora load sql-expert /models/adapters/sql-expert --deployment llama-8b --url http://10.0.0.5:8000
  kvmesh lora unload sql-expert
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvmesh.cluster.commands.admin import add_admin_arguments, run_admin

if TYPE_CHECKING:
    from kvmesh.cluster.router_client import RouterClient


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lora", help="load or unload a LoRA adapter on a running fleet",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="lora_action", metavar="ACTION", required=True)
    load = actions.add_parser("load", help="load adapter NAME from PATH on its base model's replicas")
    load.add_argument("name", help="the adapter's name (what requests give as \"model\")")
    load.add_argument("path", help="its PEFT directory, as the replicas see it")
    load.add_argument("--deployment", default=None,
                      help="the base model's served name (needed when the router serves several)")
    unload = actions.add_parser("unload", help="unload adapter NAME from every replica")
    unload.add_argument("name", help="the adapter's name")
    for p in (load, unload):
        add_admin_arguments(p)
        p.set_defaults(func=run)


def describe(answer: dict) -> str:
    """One line of what the router did."""
    failed = answer.get("failed") or {}
    if "loaded_on" in answer:
        done = answer["loaded_on"]
        line = (f"{answer.get('lora_name')} loaded on {len(done)} replica(s)"
                + (f" of {answer['base_model_name']}" if answer.get("base_model_name") else "")
                + (f": {', '.join(done)}" if done else ""))
    else:
        done = answer.get("unloaded_from") or []
        line = (f"{answer.get('lora_name')} unloaded from {len(done)} replica(s)"
                + (f": {', '.join(done)}" if done else ""))
    return line + "".join(f"; {rid} failed: {why}" for rid, why in failed.items())


def run(args: argparse.Namespace) -> int:
    def call(client: RouterClient) -> dict:
        if args.lora_action == "load":
            return client.load_lora_adapter(args.name, args.path, args.deployment)
        return client.unload_lora_adapter(args.name)

    return run_admin(args, f"lora {args.lora_action}", call, describe)
