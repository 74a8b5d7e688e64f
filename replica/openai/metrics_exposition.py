"""``GET /metrics`` for the router and the replicas: one exposition with content negotiation.

A scraper whose ``Accept`` lists ``application/openmetrics-text`` (Prometheus does by default) gets
OpenMetrics 1.0.0; everyone else the classic text format 0.0.4. Names are written as they are in
both: every kvmesh and vLLM name fits the classic alphabet ``[a-zA-Z_:][a-zA-Z0-9_:]*``, so no
escaping is needed -- and prometheus_client's own negotiation must not be used for the body: under
its default ``escaping=underscores`` it rewrites the colon of sample names (``vllm:e2e_..._bucket``
-> ``vllm_e2e_..._bucket``), and vLLM's dashboards would find nothing. Both registries also carry
the standard process collectors (``process_*``, ``python_info``, ``python_gc_*``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.responses import Response

OPENMETRICS = "application/openmetrics-text"


def add_process_collectors(registry: CollectorRegistry) -> None:
    """Register CPU / memory / open fds of this process, the Python version and GC counts."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def wants_openmetrics(accept: str | None) -> bool:
    """True when the ``Accept`` header lists OpenMetrics (at any quality above 0)."""
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media == OPENMETRICS and all(_quality(p) > 0 for p in params):
            return True
    return False


def _quality(param: str) -> float:
    """The value of a ``q=`` parameter (1 for any other parameter or an unreadable q)."""
    name, _, value = param.partition("=")
    if name.strip() != "q":
        return 1.0
    try:
        return float(value)
    except ValueError:
        return 1.0


def metrics_response(registry: CollectorRegistry, accept: str | None) -> Response:
    """The registry's samples as OpenMetrics 1.0.0 when ``accept`` lists it, else as text 0.0.4."""
    if wants_openmetrics(accept):
        body = openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8)  # = no escaping, see above
        return Response(body, headers={"content-type": openmetrics.CONTENT_TYPE_LATEST})
    return Response(text_format.generate_latest(registry),
                    headers={"content-type": text_format.CONTENT_TYPE_PLAIN_0_0_4})
