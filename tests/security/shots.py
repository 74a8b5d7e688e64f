"""One hostile HTTP request of the Responses noisy-neighbour attack (``Shot``), how it is sent and what it may get.

A shot is whole: its method, path, headers (as sent, duplicates and all: the noisy tenant's key unless it names its
own ``Authorization``) and body. ``expect`` says what answer it may get beyond the rule every shot keeps (a 2xx, or
a 4xx with an OpenAI-shaped error, within the suite's bound; never a 5xx): ``NOT_FOUND`` a 404 that says neither
that another tenant holds the id nor that it expired, ``EXPIRED`` a 404 that says it expired. ``send`` keeps whether
the answer carries the light tenant's marker anywhere (``leak``): no shot may read another tenant's data.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

ANY, NOT_FOUND, EXPIRED = "any", "not found", "expired"
HEAD_CHARS = 300
"""Characters of an answer kept in the results."""
NOISY = "{noisy}"
"""Stands for the noisy tenant's key in a shot's headers (filled in when sent)."""


@dataclass(frozen=True)
class Shot:
    name: str
    method: str
    path: str
    body: Callable[[], bytes] | None = None
    headers: tuple[tuple[str, str | bytes], ...] = (("authorization", f"Bearer {NOISY}"),)
    expect: str = ANY


def post(name: str, body: dict | bytes | Callable[[], bytes], path: str = "/v1/responses", expect: str = ANY,
         headers: tuple[tuple[str, str | bytes], ...] = ()) -> Shot:
    """A POST of ``body`` (a dict, its bytes, or a function that writes them when sent) with the noisy key."""
    if isinstance(body, bytes):
        make = lambda: body  # noqa: E731
    else:
        make = body if callable(body) else (lambda: json.dumps(body).encode())
    return Shot(name, "POST", path, make, (("authorization", f"Bearer {NOISY}"), *headers), expect)


def openai_error(text: str) -> bool:
    """``{"error": {"message": str, "type": ...}}``."""
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


def send(client: httpx.Client, shot: Shot, key: str, marker: str, timeout_s: float) -> dict:
    """``shot`` sent with ``key`` as the noisy tenant's: its status (or ``timeout`` / the client's error), when it was
    sent and answered (``time.monotonic``), whether a 4xx was OpenAI-shaped, whether ``marker`` was in the answer."""
    headers = [(k, v.replace(NOISY, key) if isinstance(v, str) else v) for k, v in shot.headers]
    if shot.body is not None:
        headers.append(("content-type", "application/json"))
    result: dict = {"name": shot.name, "expect": shot.expect, "t0": time.monotonic()}
    try:
        request = client.build_request(shot.method, shot.path, content=shot.body() if shot.body else None,
                                       timeout=timeout_s)
        request.headers = httpx.Headers([*((k, v) for k, v in request.headers.multi_items()
                                           if k.lower() not in ("content-type",)), *headers])
        r = client.send(request)
        text = r.text
        result |= {"status": r.status_code, "head": text[:HEAD_CHARS], "openai_error": openai_error(text),
                   "leak": marker in text}
    except httpx.TimeoutException:
        result |= {"status": "timeout", "head": "", "openai_error": False, "leak": False}
    except httpx.HTTPError as e:
        result |= {"status": type(e).__name__, "head": str(e)[:HEAD_CHARS], "openai_error": False, "leak": False}
    result["t1"] = time.monotonic()
    return result


def verdict(result: dict, hang_s: float) -> str | None:
    """What is wrong with a shot's answer (None: nothing): the module doc's rules."""
    status, head = result["status"], result["head"]
    if result["leak"]:
        return "the answer carries the light tenant's data"
    if not isinstance(status, int) or status >= 500 or (status >= 300 and not result["openai_error"]):
        return "not a 2xx nor a 4xx with an OpenAI-shaped error"
    if result["t1"] - result["t0"] > hang_s:
        return f"answered after {hang_s}s"
    if result["expect"] == NOT_FOUND and (status != 404 or "not found" not in head or "expired" in head):
        return "not the plain 404 of an id never stored"
    if result["expect"] == EXPIRED and (status != 404 or "expired" not in head):
        return "not the 404 that says the response expired"
    return None
