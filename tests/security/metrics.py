"""Reading one Prometheus sample off a replica's public ``/metrics``."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def replica_sample(url: str, name: str, labels: dict[str, str] | None = None, total: bool = False) -> float:
    """The value of sample ``name`` (with ``labels``) at ``url``/metrics; with ``total``, summed over its
    labels. A series the replica does not export fails the test (a renamed metric must not read as 0)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
             and (labels is None or all(s.labels.get(k) == v for k, v in labels.items()))]
    assert found, f"{url}/metrics has no {name}{labels or ''} (renamed? align tests/security/names.py)"
    return sum(s.value for s in found) if total else found[0].value
