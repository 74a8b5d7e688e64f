"""Driver run INSIDE the head's network namespace by test_multinode_netns.py (not a test module).

Joins the two-node Ray cluster, serves 2 replicas of the embedded model (one per node), sends a
request through the router, prints one JSON line with what it saw, and shuts everything down.
"""

from __future__ import annotations

import json
import sys

import httpx
from kvmesh.cluster.config.loader import from_dict
from kvmesh.cluster.launch.launcher import ServeCluster


def main(address: str) -> int:
    config = from_dict({
        "engine": {"kv_cache_memory": "16MiB", "max_num_batched_tokens": 512},
        "replicas": {"num_replicas": 2, "http_port": 0, "event_port": 0},
        "router": {"port": 0},
        "ray": {"address": address, "ready_timeout_s": 240, "placement": "spread"},
    })
    messages: list[str] = []
    cluster = ServeCluster(config, report=messages.append)
    result: dict = {}
    try:
        cluster.start()
        replicas = [h.endpoints for h in cluster.state.replicas]
        body = {"model": cluster.state.served_model_name, "prompt": "Once upon a time", "max_tokens": 8}
        answer = httpx.post(cluster.url + "/v1/completions", json=body, timeout=60, trust_env=False)
        result = {
            "router_url": cluster.url,
            "replica_nodes": [r["node_id"] for r in replicas],
            "replica_urls": [r["http_url"] for r in replicas],
            "status": answer.status_code,
            "completion_tokens": answer.json().get("usage", {}).get("completion_tokens"),
            "healthy": cluster.state.router_client.health().get("healthy_replicas"),
        }
    except Exception as e:  # report, then clean up
        result = {"error": f"{type(e).__name__}: {e}", "messages": messages}
    finally:
        cluster.stop()
    print("RESULT " + json.dumps(result), flush=True)
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
