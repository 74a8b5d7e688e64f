"""A client's ``request_id`` names its answer (``cmpl-<request_id>``, vLLM's) whatever characters it holds: the
body carries it as sent, the ``X-Request-Id`` header percent-encoded where a header cannot carry it, never a 500
(which a router would count as the replica's failure)."""

from __future__ import annotations

from urllib.parse import unquote

import httpx
import pytest

from .stories_replica import stories_replica

IDS = ["plain-id_1.2", "e\u0301t\u00e9", "a\r\nX-Evil: 1", "nul\x00", "\u202ebidi\ufeff", "spa ce%41"]


@pytest.fixture(scope="module")
def client(stories_path):
    with stories_replica(stories_path) as runtime, httpx.Client(base_url=runtime.http.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_any_request_id_names_the_answer_and_its_header(client, stream):
    for request_id in IDS:
        body = {"prompt": "Once upon a time", "max_tokens": 2, "request_id": request_id, "stream": stream}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, (request_id, r.text)
        header = r.headers["x-request-id"]
        assert header.isascii() and header.isprintable() and unquote(header) == f"cmpl-{request_id}"
        if not stream:
            assert r.json()["id"] == f"cmpl-{request_id}"
    assert client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 1, "request_id": "abc"}).headers[
        "x-request-id"] == "cmpl-abc"  # a plain id as it is
