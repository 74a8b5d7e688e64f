"""The noisy tenant: every hostile case of hostile_fields.py sent to a router, ``--concurrency`` at a time, from its
own process (so building and sending megabytes takes nothing from the process that times the light tenant).

    python tests/security/noisy_attacker.py URL KEY OUT.jsonl [--concurrency 4] [--timeout-s 25] [--deadline-s 300]
                                             [--match REGEX]     # only the cases whose name matches (a replay)
    python tests/security/noisy_attacker.py URL KEY OUT.jsonl --plain-s 8   # the control: plain requests only

Cases go in their order (a field's cases follow each other, so the ones in flight at any moment are of one or two
fields); each answer is one JSON line of ``OUT``: the case, its status (or ``timeout`` / the client's error), when it
was sent and answered (``time.monotonic``, the clock the light tenant's timings use too), whether a 4xx was
OpenAI-shaped, and the answer's first bytes. Cases not sent by ``--deadline-s`` are lines too, status ``not sent``.
``--plain-s`` sends, as many at a time, the endpoints' plain requests for that long instead: the same volume with
nothing hostile in it, what the light tenant's latency under attack is compared with.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the suite's own modules

from tests.security.hostile_fields import ENDPOINTS, Case, cases  # noqa: E402
from tests.security.hostile_values import raw  # noqa: E402

HEAD_CHARS = 300
"""Characters of an answer kept in the results."""


def openai_error(text: str) -> bool:
    """``{"error": {"message": str, "type": ...}}``."""
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and "type" in error


def send(client: httpx.Client, case: Case, key: str, timeout_s: float) -> dict:
    result = {"name": case.name, "field": case.field, "path": case.endpoint.path}
    body = case.body()
    result["t0"] = time.monotonic()
    try:
        with client.stream("POST", case.endpoint.path, content=body, timeout=timeout_s,
                           headers={"Authorization": f"Bearer {key}", "content-type": "application/json"}) as r:
            text = "".join(r.iter_text())
            deadline_hit = time.monotonic() - result["t0"] > timeout_s
            result |= {"status": "timeout" if deadline_hit else r.status_code, "head": text[:HEAD_CHARS],
                       "openai_error": openai_error(text)}
    except httpx.TimeoutException:
        result |= {"status": "timeout", "head": "", "openai_error": False}
    except httpx.HTTPError as e:
        result |= {"status": type(e).__name__, "head": str(e)[:HEAD_CHARS], "openai_error": False}
    result["t1"] = time.monotonic()
    return result


def attack(url: str, key: str, out: Path, concurrency: int, timeout_s: float, deadline_s: float,
           match: str | None = None) -> None:
    lock, local = threading.Lock(), threading.local()
    deadline = time.monotonic() + deadline_s

    def one(case: Case) -> None:
        if time.monotonic() > deadline:
            now = time.monotonic()
            result = {"name": case.name, "field": case.field, "path": case.endpoint.path, "t0": now, "t1": now,
                      "status": "not sent", "head": f"the attack ran past its {deadline_s}s", "openai_error": False}
        else:
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=url)
            result = send(local.client, case, key, timeout_s)
        with lock, out.open("a") as f:
            f.write(json.dumps(result) + "\n")

    chosen = [c for c in cases() if match is None or re.search(match, c.name)]
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in pool.map(one, chosen):
            pass


def plain(url: str, key: str, concurrency: int, seconds: float) -> None:
    """The endpoints' plain requests (``request_id`` null: nothing hostile), ``concurrency`` at a time for
    ``seconds``."""
    deadline = time.monotonic() + seconds
    plain_cases = [Case(endpoint, "request_id", raw("null", "null")) for endpoint in ENDPOINTS]

    def loop(i: int) -> None:
        with httpx.Client(base_url=url) as client:
            while time.monotonic() < deadline:
                result = send(client, plain_cases[i % len(plain_cases)], key, seconds)
                assert result["status"] == 200, result
                i += 1

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(loop, range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("out", type=Path)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=25.0, help="a request's bound")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="no case is sent after this")
    parser.add_argument("--match", help="only the cases whose name (path field = value) matches this regex")
    parser.add_argument("--plain-s", type=float, help="send plain requests for this long instead (the control)")
    args = parser.parse_args()
    if args.plain_s:
        plain(args.url, args.key, args.concurrency, args.plain_s)
        return
    attack(args.url, args.key, args.out, args.concurrency, args.timeout_s, args.deadline_s, args.match)


if __name__ == "__main__":
    main()
