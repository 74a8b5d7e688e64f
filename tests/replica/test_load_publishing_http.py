"""The load a replica publishes counts a request from the moment it is queued, over HTTP: while its prompt is still
being computed, the router's booking is acknowledged and the prompt's uncached tokens are in the replica's intake.
A router overwrites its own count of a replica's intake with the published one; a request left out until its
first token made a replica busy with a long prefill look idle to every router for the whole prefill."""

from __future__ import annotations

import threading
import time

import httpx
from kvmesh.replica.emulate.config import EmulationConfig
from kvmesh.replica.openai.router_booking import booking_header

from .stories_replica import stories_replica

PROMPT = [1] + [40 + i % 400 for i in range(1999)]
"""2,000 tokens: about 0.15 s of an H100's prefill, 1.5 s at a tenth of its speed."""


def test_a_request_is_in_the_published_load_while_its_prompt_is_computed(stories_path):
    emulated = {"emulation": EmulationConfig(emulate="h100-8b", emulate_time_dilation=10.0),
                "kv_cache_memory": "256MiB", "max_model_len": 4096}
    with stories_replica(stories_path, **emulated) as runtime:
        publishing = runtime.state.load_publishing
        assert publishing is not None, "the replica publishes no load"
        url = runtime.http.url
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        first_token_at: list[float] = []

        def stream() -> None:
            body = {"model": model, "prompt": PROMPT, "max_tokens": 2, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60,
                              headers=booking_header("router-a", 7, 1500)) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data:") and '"text"' in line and not first_token_at:
                        first_token_at.append(time.monotonic())

        client = threading.Thread(target=stream)
        client.start()
        counted = None
        deadline = time.monotonic() + 30
        while counted is None and time.monotonic() < deadline and not first_token_at:
            update = publishing.update(force=True)
            if update.accepted.get("router-a") == 7:
                counted = (time.monotonic(), update)
            time.sleep(0.02)
        client.join(timeout=60)
        assert first_token_at, "the request produced no token"
        assert counted is not None and counted[0] < first_token_at[0], \
            "the booking was acknowledged only once the request's first token came"
        update = counted[1]
        assert update.recent_prefill > 1490  # the intake the router expects it to compute (decayed a little)
        assert update.queued_prefill_tokens <= 1500  # its queue counts what the router expects uncached


def test_a_refused_request_leaves_the_published_load_as_it_was(stories_path):
    """A tenant whose requests the replica refuses (here a prompt past the context) makes it look no busier to the
    routers: no queue entry and no intake stay behind, whichever check refused it."""
    emulated = {"emulation": EmulationConfig(emulate="h100-8b"), "kv_cache_memory": "256MiB", "max_model_len": 512}
    with stories_replica(stories_path, **emulated) as runtime:
        publishing = runtime.state.load_publishing
        url = runtime.http.url
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        before = publishing.update(force=True)
        for number in range(1, 6):
            r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": PROMPT[:600], "max_tokens": 2},
                           headers=booking_header("router-a", number, 600), timeout=30)
            assert r.status_code == 400, r.text
        after = publishing.update(force=True)
        assert (after.num_waiting, after.queued_prefill_tokens) == (before.num_waiting, before.queued_prefill_tokens)
        assert after.recent_prefill < 1 and after.recent_requests < 1e-6
