"""Bounded load for the fleet tests: N client threads sending streamed completions until stopped.

Every request is checked as a user would: HTTP 200, chunks that parse, no error event, ``[DONE]``
last. Each outcome is kept with its time and (from ``include_usage``) its prompt and cached
tokens, so a test can count failures and follow the hit rate over time.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import httpx

# ~120 stories260K tokens shared by every prompt of a "user": the cache has something to keep
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
         "with her friends. One day, she saw a big red ball under a tree. She ran to the ball and picked it up. ")


@dataclass
class Outcome:
    at: float
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Load:
    """``clients`` threads, each looping over its own prefix family, until ``stop()`` or ``max_s``."""

    def __init__(self, url: str, model: str, clients: int, max_tokens: int = 24, families: int = 4,
                 max_s: float = 240.0) -> None:
        self.url, self.model, self.max_tokens, self.families = url, model, max_tokens, families
        self.deadline = time.monotonic() + max_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)
        return self.outcomes

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    def _client(self, i: int) -> None:
        with httpx.Client(timeout=120) as http:
            n = 0
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                family = (i + n) % self.families
                prompt = f"Story {family}. " + STORY + f"Question {i}-{n}: what did Lily"
                outcome = self._one(http, prompt)
                with self._lock:
                    self.outcomes.append(outcome)
                n += 1

    def _one(self, http: httpx.Client, prompt: str) -> Outcome:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        usage = None
        try:
            with http.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    return Outcome(time.monotonic(), False, f"HTTP {r.status_code}: {r.text[:200]}")
                data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as e:
            return Outcome(time.monotonic(), False, f"{type(e).__name__}: {e}")
        if not data or data[-1] != "[DONE]":
            return Outcome(time.monotonic(), False, f"stream did not end with [DONE]: {data[-2:]}")
        for chunk in map(json.loads, data[:-1]):
            if "error" in chunk:
                return Outcome(time.monotonic(), False, f"error event: {chunk['error']}")
            usage = chunk.get("usage") or usage
        if not usage:
            return Outcome(time.monotonic(), False, "no usage chunk")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Outcome(time.monotonic(), True, prompt_tokens=usage["prompt_tokens"], cached_tokens=cached)
