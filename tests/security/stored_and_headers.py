"""Stored-response ids and request headers, attacked by the noisy tenant (``stored_shots(ids)``, ``header_shots(ids)``).

``Ids`` are what the scene holds when the attack starts: the light tenant's stored response (whose input carries its
marker) and one of its that expired, the noisy tenant's own stored response and one of its own that expired. Another
tenant's id, live or expired, is a 404 exactly like an id never stored (``NOT_FOUND``), on every route that takes one
(continue, retrieve, list its input items, delete); the noisy tenant's own expired id says it expired (``EXPIRED``;
not deleted here: a delete takes the note, and the shots run a few at a time in any order).
Headers: huge, many, duplicated, invalid credentials, and headers that lie about who is calling (a tenant named in a
header, the router's own headers): none makes the noisy tenant the light one (the light tenant's response carries its
marker in its metadata and instructions, so a retrieval that reads it leaks the marker).
"""

from __future__ import annotations

from dataclasses import dataclass

from .shots import EXPIRED, NOISY, NOT_FOUND, Shot, post

PREFIX = "/v1/responses/"
PLAIN = {"input": "hi", "max_output_tokens": 4}


@dataclass(frozen=True)
class Ids:
    light: str
    light_expired: str
    own: str
    own_expired: str


def _on_every_route(label: str, response_id: str, expect: str, headers: tuple = (),
                    delete: bool = True) -> list[Shot]:
    """The id continued, retrieved, listed and (``delete``) deleted."""
    auth = (("authorization", f"Bearer {NOISY}"), *headers)
    shots = [post(f"{label}: continued", {**PLAIN, "previous_response_id": response_id}, expect=expect,
                  headers=headers),
             Shot(f"{label}: retrieved", "GET", PREFIX + response_id, headers=auth, expect=expect),
             Shot(f"{label}: its input items", "GET", f"{PREFIX}{response_id}/input_items", headers=auth,
                  expect=expect),
             Shot(f"{label}: its input items, a page", "GET",
                  f"{PREFIX}{response_id}/input_items?order=asc&limit=100", headers=auth, expect=expect)]
    deleted = Shot(f"{label}: deleted", "DELETE", PREFIX + response_id, headers=auth, expect=expect)
    return [*shots, deleted] if delete else shots


def stored_shots(ids: Ids) -> list[Shot]:
    """The module doc's stored-id attacks (the noisy tenant's own live one is only listed: it stays)."""
    own = ("authorization", f"Bearer {NOISY}"),
    queries = ("limit=" + "9" * 5000, "limit=\u00b2", "limit=0", "order=sideways", "after=" + ids.light,
               "after=%00", "limit=1&limit=2", "after=" + "a" * 30_000)
    return [*_on_every_route("another tenant's id", ids.light, NOT_FOUND),
            *_on_every_route("another tenant's expired id", ids.light_expired, NOT_FOUND),
            *_on_every_route("its own expired id", ids.own_expired, EXPIRED, delete=False),  # its note stays
            *_on_every_route("another tenant's id in other case", ids.light.upper(), NOT_FOUND),
            *_on_every_route("another tenant's id with a trailing space", ids.light + " ", NOT_FOUND),
            *(Shot(f"its own id's input items ?{q[:24]}", "GET", f"{PREFIX}{ids.own}/input_items?{q}", headers=own)
              for q in queries),
            *(Shot(f"a stored path {path[:24]!r}", method, PREFIX + path, headers=own) for method, path in (
                ("GET", "..%2F..%2Fv1%2Fmodels"), ("GET", "%00"), ("GET", "%ff%fe"), ("GET", "a" * 60_000),
                ("DELETE", "*"), ("DELETE", "%25"), ("GET", f"{ids.light}/input_items/../..")))]


def header_shots(ids: Ids) -> list[Shot]:
    """The module doc's header attacks, each on the light tenant's stored response (a GET) or a plain request."""
    key = ("authorization", f"Bearer {NOISY}")
    liars = (("x-kvmesh-tenant", "light"), ("x-kvmesh-router", "light"), ("x-kvmesh-replica-id", "replica-0"),
             ("openai-organization", "light"), ("openai-project", "light"), ("x-tenant", "light"),
             ("x-forwarded-user", "light"), ("x-api-key", "light"))
    out = [*_on_every_route("another tenant's id, headers naming it", ids.light, NOT_FOUND, liars)]
    heads: tuple[tuple[str, tuple], ...] = (
        ("two Authorization headers", (key, ("authorization", "Bearer sk-light-not-its-key"))),
        ("an empty bearer", (("authorization", "Bearer"),)), ("Basic credentials", (("authorization", "Basic YTpi"),)),
        ("a key of 60,000 characters", (("authorization", "Bearer " + "k" * 60_000),)),
        ("a key of 70,000 characters", (("authorization", "Bearer " + "k" * 70_000),)),
        ("a key of bytes that are not text", (("authorization", b"Bearer \xff\xfe\x80"),)),
        ("the light tenant's name as its key", (("authorization", "Bearer light"),)),
        ("no credentials", ()), ("a header of 60,000 bytes", (key, ("x-big", "v" * 60_000))),
        ("a header of 1 MB", (key, ("x-big", "v" * (1 << 20)))),
        ("99 headers", (key, *((f"x-h{i}", "v") for i in range(98)))),
        ("2,000 headers", (key, *((f"x-h{i}", "v") for i in range(2000)))),
        ("a priority of 5,000 digits", (key, ("x-kvmesh-priority", "9" * 5000))),
        ("the best priority", (key, ("x-kvmesh-priority", "-2147483647"))),
        ("a TTFT deadline of -1", (key, ("x-kvmesh-ttft-deadline-ms", "-1"))),
        ("a KV pull from the metadata service", (key, ("x-kvmesh-kv-pull", "http://169.254.169.254/"))),
        ("a huge session", (key, ("x-session-id", "s" * 60_000))),
        ("two content types", (key, ("content-type", "text/plain"))),
        ("a gzip body that is not", (key, ("content-encoding", "gzip"))))
    for label, headers in heads:
        out.append(Shot(f"headers: {label}, retrieving another tenant's id", "GET", PREFIX + ids.light,
                        headers=headers))
        out.append(Shot(f"headers: {label}, a plain request", "POST", "/v1/responses",
                        lambda: b'{"input": "hi", "max_output_tokens": 4}', headers))
    return out
