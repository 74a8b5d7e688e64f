"""What ``kvmesh scale``, ``drain`` and ``rollout`` share: the router address, both keys, the errors, --wait.

The admin key comes from ``KVMESH_ADMIN_KEY``, ``--admin-key-file``, or the record of the running
``kvmesh serve`` (``~/.cache/kvmesh/clusters/``, mode 0600; cluster/admin_key.py), which also gives
the router's URL when only one cluster runs here; the tenant API key (reading ``/replicas``) from
``--api-key`` or ``KVMESH_API_KEY``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.cluster.router_client import RouterClient


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None,
                        help="router URL (default: the one kvmesh serve running here, else http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=None, help="router API key (default: $KVMESH_API_KEY)")
    parser.add_argument("--admin-key-file", default=None,
                        help="file holding the admin key, or a cluster record (default: $KVMESH_ADMIN_KEY, else the "
                             "record of the cluster at --url in ~/.cache/kvmesh/clusters/)")
    parser.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                        help="wait up to this long for the operation to finish; 0 = return at once (default "
                             "%(default)s)")


def run_admin(args: argparse.Namespace, command: str, call: Callable[[RouterClient], dict],
              describe: Callable[[dict], str], done: Callable[[dict], bool] | None = None) -> int:
    """Send one admin call, print what it did (``describe``), then (with --wait) follow GET /admin/fleet
    until ``done``."""
    import asyncio

    import aiohttp
    from kvmesh.cluster.admin_key import find_admin_key
    from kvmesh.cluster.router_client import RouterClient

    try:
        args.url, admin_key = find_admin_key(args.url, args.admin_key_file)
    except ValueError as e:
        print(f"kvmesh {command}: {e}", file=sys.stderr)
        return 2
    client = RouterClient(args.url, api_key=args.api_key or os.environ.get("KVMESH_API_KEY"), admin_key=admin_key,
                          timeout_s=30)
    try:
        answer = call(client)
        print(f"kvmesh {command}: {describe(answer)}", flush=True)
        if done is None or not args.wait or answer.get("will_be_removed") is False:
            return 0  # nothing to follow (a drain on a standalone router removes no process)
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            state = client.fleet()
            if state["busy"] is None and not state["queued"] and done(state):
                last = state["operations"][-1] if state["operations"] else {}
                print(f"kvmesh {command}: done; {len(state['replicas'])} replica(s): {', '.join(state['replicas'])}"
                      + (f" ({last['operation']}: {last['outcome']}, {last['seconds']}s)" if last else ""))
                return 0 if last.get("outcome", "ok") == "ok" else 1
            time.sleep(0.5)
        print(f"kvmesh {command}: still running after {args.wait:g}s; `kvmesh status` shows progress",
              file=sys.stderr)
        return 1
    except aiohttp.ClientResponseError as e:
        hint = {401: " (set --api-key or KVMESH_API_KEY)", 403: " (the admin key is not this router's: "
                "KVMESH_ADMIN_KEY or --admin-key-file hold another cluster's; without them the key of the cluster "
                "at --url is found by itself)"}.get(e.status, "")
        print(f"kvmesh {command}: router answered {e.status}: {e.message}{hint}", file=sys.stderr)
        return 1
    except ValueError as e:  # the command's own check refused (e.g. drain --deployment of another's replica)
        print(f"kvmesh {command}: {e}", file=sys.stderr)
        return 2
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        print(f"kvmesh {command}: no router at {args.url} ({type(e).__name__}); is `kvmesh serve` running? "
              "Pass --url for another address.", file=sys.stderr)
        return 1
    finally:
        client.close()
