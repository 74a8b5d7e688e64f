"""A policy asked to choose among no candidates: ``NoReplicaError`` (the router answers 503).

Its own module: a policy's ``choose`` checks its candidates here, so that ``Policy.decide`` (base.py), which calls
``choose``, is not entered again from below on a request's path (tests/router/test_request_path.py)."""

from __future__ import annotations

from collections.abc import Sized


class NoReplicaError(RuntimeError):
    """No candidate replica was given to a policy (every replica is unhealthy or none exists)."""


def check_candidates(candidates: Sized) -> None:
    """Raise ``NoReplicaError`` when there is no candidate replica."""
    if not candidates:
        raise NoReplicaError("no healthy replica to route to; start or register a replica")
