"""``GET /metrics`` for the router and the replicas: one exposition with content negotiation.

A scraper that sends ``Accept: application/openmetrics-text`` (Prometheus does by default) gets
prometheus_client's OpenMetrics exposition; everyone else the classic text format 0.0.4. Both
registries also carry the standard process collectors (``process_*``, ``python_info``,
``python_gc_*``), as vLLM's API server and every Python exporter do.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from starlette.responses import Response


def add_process_collectors(registry: CollectorRegistry) -> None:
    """Register CPU / memory / open fds of this process, the Python version and GC counts."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def metrics_response(registry: CollectorRegistry, accept: str | None) -> Response:
    """The registry's samples in the format ``accept`` asks for (OpenMetrics or text 0.0.4)."""
    encode, content_type = choose_encoder(accept or "")
    return Response(encode(registry), headers={"content-type": content_type})
