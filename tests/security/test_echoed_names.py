"""Errors never send a client's long string back whole: a 404 used to echo a 100,000-character model name.

Every error that repeats a client's string (a model or adapter name, a field's name or value) cuts it with
``replica.serving.errors.echo`` (200 characters, an ellipsis and the length), on the router (live, in front of a
fake replica) and on the replica (its model check, its adapters, its request validation).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from kvmesh.replica.openai.errors import parse_request
from kvmesh.replica.openai.protocol import CompletionRequest
from kvmesh.replica.server.lora_models import ServedLoRAs
from kvmesh.replica.serving.errors import ECHO_CHARS, ProtocolError, echo
from kvmesh.replica.serving.model_names import check_model
from kvmesh.replica.serving.tokenizer import load_tokenizer
from kvmesh.router.config import RouterConfig, UpstreamConfig
from kvmesh.router.control.router_server import RouterServer

from ..router.conftest import launched_fakes, wait_for

LONG = "m" * 100_000
"""The attacker's name."""
MAX_MESSAGE = ECHO_CHARS * 2 + 300
"""The longest error message an echoed name may make (the rest of the message is a sentence or two)."""
ADMIN_KEY = "admin-key-for-echo"


def assert_cut(message: str) -> None:
    assert len(message) < MAX_MESSAGE and "characters)" in message, (len(message), message[:300])


def test_echo_cuts_long_strings_and_keeps_short_ones():
    assert echo("tiny") == "tiny" and echo(12) == "12"
    cut = echo(LONG)
    assert cut.startswith("m" * ECHO_CHARS + "…") and cut.endswith("(100000 characters)")


def test_the_router_cuts_a_long_model_or_adapter_name(tmp_path, stories_path):
    with launched_fakes("echo") as (fake,):
        cfg = RouterConfig(port=0, block_size=4, admin_key=ADMIN_KEY, served_model_name="stub",
                           upstream=UpstreamConfig(poll_interval_s=0.1, connect_timeout_s=1.0))
        server = RouterServer(cfg, [fake.spec], tokenizer=load_tokenizer(stories_path)).start()
        try:
            wait_for(lambda: server.runtime.router.healthy, what="the fake replica healthy")
            with httpx.Client(base_url=server.url, timeout=10) as client:
                for path in ("/v1/completions", "/v1/chat/completions"):
                    body = {"model": LONG, "max_tokens": 2, "prompt": "hi", "messages": [{"role": "user",
                                                                                          "content": "hi"}]}
                    r = client.post(path, json=body)
                    assert r.status_code == 404, r.text[:300]
                    assert_cut(r.json()["error"]["message"])
                r = client.post("/v1/unload_lora_adapter", json={"lora_name": LONG},
                                headers={"Authorization": f"Bearer {ADMIN_KEY}"})
                assert r.status_code == 404, r.text[:300]
                assert_cut(r.json()["error"]["message"])
                r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "logit_bias": {LONG: 1}})
                assert r.status_code == 400, r.text[:300]
                assert_cut(r.json()["error"]["message"])
        finally:
            server.stop()


def test_the_replica_cuts_a_long_model_name():
    with pytest.raises(ProtocolError) as refused:
        check_model(LONG, "stories")
    assert refused.value.status_code == 404
    assert_cut(refused.value.message)


def test_the_replica_cuts_a_long_adapter_name():
    loras = ServedLoRAs(engine_client=None, base_names=("stories",), enabled=True)
    with pytest.raises(ProtocolError) as refused:
        asyncio.run(loras.unload(LONG))
    assert refused.value.status_code == 404
    assert_cut(refused.value.message)


@pytest.mark.parametrize("body", [{"logit_bias": {LONG: 1}}, {"logit_bias": {LONG: "not a number"}}],
                         ids=["logit_bias key", "a field's place in the validation error"])
def test_a_long_field_is_cut_in_the_validation_error(body):
    with pytest.raises(ProtocolError) as refused:
        parse_request(CompletionRequest, {"model": "stories", "prompt": "hi", **body}).to_sampling_params(8, 64)
    assert refused.value.status_code == 400
    assert_cut(refused.value.message)


def test_a_long_path_is_cut_in_an_auth_refusal():
    from kvmesh.replica.openai.auth import AuthMiddleware

    auth = AuthMiddleware(None, api_key="tenant-key-1", admin_key="admin-key-1", internal_key="internal-key-1",
                          is_kv_plane=lambda path: path.startswith("/kv/"),
                          is_admin=lambda method, path: path.startswith("/admin/"))
    for path in ("/kv/" + LONG, "/admin/" + LONG):
        refused = auth.refusal("POST", path, b"Bearer tenant-key-1")
        assert refused is not None and 400 <= refused.status_code < 500
        assert_cut(refused.message)
