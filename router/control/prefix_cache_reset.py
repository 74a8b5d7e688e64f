"""``POST /reset_prefix_cache`` on the router (admin plane): every registered replica is asked, with the cluster's
internal key, to reset its own prefix cache (replica/openai/prefix_cache_reset.py), all at once.

The router's index is not touched here: each replica's reset reaches it as that replica's events
(``AllBlocksCleared``, or ``BlockRemoved`` for what it freed while requests held the rest), the one way the index
learns what a replica holds. The answer names every replica: ``{"freed_blocks": N}``, or ``{"error": why}`` for
one that refused, failed or did not answer within the upstream first-byte deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from kvmesh.replica.openai.prefix_cache_reset import RESET_PREFIX_CACHE_PATH
from kvmesh.router.http.upstream import UpstreamError

if TYPE_CHECKING:
    from kvmesh.router.config import ReplicaSpec
    from kvmesh.router.control.replica_calls import ReplicaCalls
    from kvmesh.router.http.upstream import UpstreamPool

logger = logging.getLogger(__name__)


async def reset_every_replica(specs: list[ReplicaSpec], calls: ReplicaCalls) -> dict[str, dict[str, object]]:
    """Ask every replica of ``specs`` to reset its prefix cache (through ``calls``' control client); each one's
    answer (or error) by replica id."""
    upstream, pool = calls.upstream, calls.control
    timeout_s = upstream.first_byte_timeout_s or upstream.request_timeout_s
    headers = calls.headers()
    answers = await asyncio.gather(*(_reset_one(spec, pool, headers, timeout_s) for spec in specs))
    return {spec.replica_id: answer for spec, answer in zip(specs, answers, strict=True)}


async def _reset_one(spec: ReplicaSpec, pool: UpstreamPool, headers: dict[str, str],
                     timeout_s: float | None) -> dict[str, object]:
    try:
        status, _, raw = await pool.fetch("POST", spec.url, RESET_PREFIX_CACHE_PATH, timeout_s, b"", headers)
    except asyncio.TimeoutError:
        return {"error": f"no answer within {timeout_s:g} s (upstream.first_byte_timeout_s)"}
    except (UpstreamError, OSError) as e:
        return {"error": f"could not be reached: {e}"}
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        body = None
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("freed_blocks"), int):
        error = body.get("error") if isinstance(body, dict) else None
        why = error.get("message") if isinstance(error, dict) else raw[:300].decode("utf-8", "replace")
        logger.warning("replica %s refused the prefix cache reset: HTTP %d %s", spec.replica_id, status, why)
        return {"error": f"HTTP {status}: {why}"}
    logger.info("replica %s: prefix cache reset, %d blocks freed", spec.replica_id, body["freed_blocks"])
    return {"freed_blocks": body["freed_blocks"]}
