"""A blocking JSON-over-HTTP call for the benchmarks' drivers (the standard library's urllib: the package's
only HTTP client is aiohttp, and a driver loop that times one request at a time needs no event loop)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    status: int
    headers: dict[str, str]
    """Response headers, names lower-cased."""
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self):
        return json.loads(self.body)

    def raise_for_status(self) -> JsonAnswer:
        if self.status >= 400:
            raise RuntimeError(f"HTTP {self.status}: {self.text[:200]}")
        return self


def call(method: str, url: str, json_body: object | None = None, timeout: float = 30.0,
         headers: dict[str, str] | None = None) -> JsonAnswer:
    """``method url`` with an optional JSON body (and ``headers``); HTTP errors come back as answers, not
    exceptions."""
    data = None if json_body is None else json.dumps(json_body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return JsonAnswer(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return JsonAnswer(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def post(url: str, json_body: object, timeout: float = 30.0) -> JsonAnswer:
    return call("POST", url, json_body, timeout)


def get(url: str, timeout: float = 30.0) -> JsonAnswer:
    return call("GET", url, None, timeout)
