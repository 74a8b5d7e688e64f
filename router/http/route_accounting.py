"""A routed request counted: its decision when made, the cached tokens its replica reported when it answered.

Both feed the router's metrics and the route receipt (router/routing/receipts.py); with ``router.access_log`` the
completed receipt is one JSON line on the ``kvmesh.router.access`` logger.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvmesh.router.http.data_plane import DataPlane
    from kvmesh.router.routing.kv_router import RouteDecision

access_log = logging.getLogger("kvmesh.router.access")
"""One JSON line per request with its route receipt (``router.access_log``)."""
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_HOST_CACHED = re.compile(rb'"host_cached_tokens"\s*:\s*(\d+)')  # kvmesh replicas with a host tier
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def count_decision(plane: DataPlane, decision: RouteDecision, prompt_tokens: int) -> None:
    """A request was sent to ``decision.replica_id``: its decision, predicted hit and prompt counted."""
    m, rid = plane.metrics, str(decision.replica_id)
    m.decisions.labels(rid, plane.router.policy_name).inc()
    m.predicted_hit_tokens.labels(rid).inc(decision.predicted_hit_tokens)
    m.prompt_tokens.labels(rid).inc(prompt_tokens)
    plane.receipt_metrics.on_route(decision.receipt)


def report_cached(plane: DataPlane, decision: RouteDecision, chunk: bytes) -> None:
    """Count the cached tokens a replica reported in ``chunk`` (its usage), against the route's receipt."""
    if b"cached_tokens" not in chunk:
        return
    found = _CACHED.findall(chunk)
    if not found:
        return
    cached = int(found[-1])
    plane.metrics.reported_cached_tokens.labels(str(decision.replica_id)).inc(cached)
    host = _HOST_CACHED.findall(chunk) if b"host_cached_tokens" in chunk else None
    receipts = plane.router.receipts
    receipt = receipts.record_actual(decision.receipt, cached, int(host[-1]) if host else None)
    plane.receipt_metrics.on_actual(receipt)
    output = _COMPLETION.findall(chunk)
    observe = partial(receipts.ceiling.observe, decision.keys, receipt.num_prompt_tokens,
                      int(output[-1]) if output else 0, cached, receipt.predicted_hit_tokens, receipt.best_hit_tokens)
    try:  # the live ceiling's replay runs after this chunk is on its way (router/routing/ceiling.py)
        asyncio.get_running_loop().call_soon(observe)
    except RuntimeError:  # no loop: a caller outside the server
        observe()
    if plane.config.access_log:
        access_log.info("%s", json.dumps(receipt.log_fields()))
