"""Another server's ``/load`` (not kvmesh's ``LoadReport``): the same counts under other names, read leniently.

    ForeignLoad                 its JSON object
    foreign_counts(report, ...) running, waiting, KV usage and queued prefill tokens, each from the first of its
                                spellings that holds a number (the value given otherwise: unknown keys ignored)
"""

from __future__ import annotations

ForeignLoad = dict[str, object]
"""Another server's ``/load`` JSON (not kvmesh's ``LoadReport``): the same numbers under other names."""

_RUNNING_KEYS = ("num_requests_running", "num_running", "running")
_WAITING_KEYS = ("num_requests_waiting", "num_waiting", "waiting")
_KV_USAGE_KEYS = ("kv_cache_usage", "kv_usage")
_PREFILL_KEYS = ("num_waiting_prefill_tokens", "queued_prefill_tokens")


def foreign_counts(report: ForeignLoad, running: int, waiting: int, kv_usage: float,
                   queued_prefill_tokens: int) -> tuple[int, int, float, int]:
    """``report``'s running and waiting requests, KV usage and queued prefill tokens; each missing one is the value
    given for it."""
    return (int(_first(report, _RUNNING_KEYS, running)), int(_first(report, _WAITING_KEYS, waiting)),
            float(_first(report, _KV_USAGE_KEYS, kv_usage)),
            int(_first(report, _PREFILL_KEYS, queued_prefill_tokens)))


def _first(report: ForeignLoad, keys: tuple[str, ...], default: int | float) -> int | float:
    """The first of ``keys`` whose value is a number; ``default`` when none is."""
    for key in keys:
        value = report.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return default
