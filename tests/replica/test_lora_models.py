"""ServedLoRAs: the replica's adapters by name, against a recording engine (no model, milliseconds)."""

from __future__ import annotations

import asyncio

import pytest
from kvmesh.replica.openai.auth import AuthMiddleware
from kvmesh.replica.server.app import admin_rule, is_replica_admin
from kvmesh.replica.server.config import ReplicaServerConfig
from kvmesh.replica.server.lora_models import ServedLoRAs
from kvmesh.replica.serving.errors import ProtocolError


class RecordingEngine:
    """add_lora / remove_lora as the engine answers them; a path named "bad" is refused as the engine would."""

    def __init__(self) -> None:
        self.added: list = []
        self.removed: list[str] = []

    async def add_lora(self, lora) -> bool:
        if lora.lora_path == "bad":
            raise ValueError("LoRA adapter 'bad' is not a directory")
        self.added.append(lora)
        return True

    async def remove_lora(self, lora_name: str) -> bool:
        self.removed.append(lora_name)
        return True

    def list_loras(self) -> list:
        return list(self.added)


def served(enabled: bool = True) -> tuple[ServedLoRAs, RecordingEngine]:
    engine = RecordingEngine()
    return ServedLoRAs(engine, ("stories", "/models/stories"), enabled), engine


def test_a_loaded_adapter_is_what_its_name_selects():
    loras, engine = served()
    lora = asyncio.run(loras.load("tiny", "/a/tiny"))
    assert loras.request_for("tiny") is lora and engine.added == [lora]
    assert loras.request_for("stories") is None and loras.request_for(None) is None
    (card,) = loras.cards(256)
    assert (card.id, card.root, card.parent) == ("tiny", "/a/tiny", "stories")


def test_ids_are_never_reused_after_an_unload():
    loras, engine = served()

    async def run():
        first = await loras.load("tiny", "/a/tiny")
        await loras.unload("tiny")
        return first, await loras.load("tiny", "/b/tiny")

    first, second = asyncio.run(run())
    assert engine.removed == ["tiny"] and second.lora_int_id > first.lora_int_id
    assert loras.request_for("tiny").lora_path == "/b/tiny"


@pytest.mark.parametrize(("name", "path", "status", "words"), [
    ("stories", "/a", 409, "base model"),
    ("/models/stories", "/a", 409, "base model"),
    ("x", "bad", 400, "not a directory"),
])
def test_a_refused_load_says_why_and_leaves_nothing_behind(name, path, status, words):
    loras, _ = served()
    with pytest.raises(ProtocolError) as e:
        asyncio.run(loras.load(name, path))
    assert e.value.status_code == status and words in str(e.value)
    assert loras.names() == ()


def test_two_loads_of_one_name_at_once_load_it_once():
    loras, engine = served()

    async def run():
        return await asyncio.gather(loras.load("tiny", "/a"), loras.load("tiny", "/a"), return_exceptions=True)

    results = asyncio.run(run())
    assert len(engine.added) == 1 and sum(isinstance(r, ProtocolError) and r.status_code == 409 for r in results) == 1


def test_without_enable_lora_loads_and_unloads_are_400_naming_the_flag():
    loras, engine = served(enabled=False)
    for call in (loras.load("tiny", "/a"), loras.unload("tiny")):
        with pytest.raises(ProtocolError) as e:
            asyncio.run(call)
        assert e.value.status_code == 400 and "--enable-lora" in str(e.value)
    assert engine.added == []


def test_adapters_the_engine_registered_at_start_are_served_and_keep_their_ids():
    from kvmesh.replica.serving.lora_request import LoRARequest

    static = LoRARequest("tiny", 3, "/a/tiny")
    loras = ServedLoRAs(RecordingEngine(), ("stories",), True, registered=[static])
    assert loras.request_for("tiny") is static
    assert asyncio.run(loras.load("late", "/a/late")).lora_int_id == 4  # no clash with the engine's ids


@pytest.mark.parametrize(("header", "status"), [
    (b"", 403), (b"Bearer tenant-key-0001", 403), (b"Bearer admin-key-00002", None), (b"Bearer internal-key-003", None),
])
def test_the_lora_admin_plane_takes_the_admin_or_internal_key_only(header, status):
    auth = AuthMiddleware(None, api_key="tenant-key-0001", admin_key="admin-key-00002", internal_key="internal-key-003",
                          is_admin=is_replica_admin)
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        refusal = auth.refusal("POST", path, header)
        assert (refusal and refusal.status_code) == status


def test_a_replica_without_any_key_leaves_the_lora_paths_open_as_vllm_does():
    assert not admin_rule(ReplicaServerConfig())("POST", "/v1/load_lora_adapter")
    assert admin_rule(ReplicaServerConfig(api_key="tenant-key-0001"))("POST", "/v1/load_lora_adapter")
    assert admin_rule(ReplicaServerConfig(internal_key="internal-key-003"))("POST", "/v1/unload_lora_adapter")
    assert not admin_rule(ReplicaServerConfig(api_key="tenant-key-0001"))("POST", "/v1/completions")
