"""A router given the cluster's salt secret the documented way keys salted prompts as the replicas hash them.

The secret's one text form is hex (the cluster record's ``router_secrets.cache_salt_secret``), in a config file and
in ``KVMESH_ROUTER_CACHE_SALT_SECRET`` alike; any other text is refused at start-up with a message naming that form,
so no router routes salted tenants blind."""

from __future__ import annotations

import base64

import pytest
from kvmesh.cluster.admin_key import RouterSecrets
from kvmesh.cluster.config.loader import ConfigError, load
from kvmesh.cluster.config.trees import ROUTER_SCHEMA
from kvmesh.events.schema import BlockStored
from kvmesh.kvcache.hashing import RequestBlockHasher, cache_salt_secret, external_hash, make_none_hash
from kvmesh.router.config import RouterConfig, build_router

BS = 4
SEED = b"the cluster's hash seed"
PROMPT = list(range(100, 113))  # three full blocks
SECRET = cache_salt_secret(SEED)
VARIABLE = "KVMESH_ROUTER_CACHE_SALT_SECRET"


def replica_stored(cache_salt: str) -> BlockStored:
    """What a replica with ``SEED`` publishes when it caches ``PROMPT`` under ``cache_salt``."""
    hasher = RequestBlockHasher(BS, make_none_hash(SEED), cache_salt=cache_salt)
    hashes = hasher.extend(PROMPT)
    return BlockStored(block_hashes=[external_hash(h) for h in hashes], parent_block_hash=None,
                       token_ids=PROMPT[: BS * len(hashes)], block_size=BS, lora_id=None, medium="GPU",
                       lora_name=None, extra_keys=[hasher.extra_keys(i) for i in range(len(hashes))])


def matched_blocks(config: RouterConfig, cache_salt: str = "tenant-a") -> int:
    router = build_router(RouterConfig(block_size=BS, cache_salt_secret=config.cache_salt_secret), seed=7)
    router.add_replica("r")
    router.apply_events("r", [replica_stored("tenant-a")])
    return router.route(PROMPT, cache_salt).matched_blocks


def from_yaml(tmp_path, text: str) -> RouterConfig:
    path = tmp_path / "router.yaml"
    path.write_text(f"router:\n  cache_salt_secret: {text}\n")
    return load(ROUTER_SCHEMA, path, env={}).router


def from_env(tmp_path, text: str) -> RouterConfig:
    return load(ROUTER_SCHEMA, None, env={VARIABLE: text}).router


def from_record(tmp_path, text: str) -> RouterConfig:
    own = RouterSecrets.of(RouterConfig(cache_salt_secret=SECRET))
    assert own.cache_salt_secret == text
    return own.apply(RouterConfig(block_size=BS))


def test_serves_own_router_matches_the_replicas_salted_blocks():
    assert matched_blocks(RouterConfig(cache_salt_secret=SECRET)) == 3
    assert matched_blocks(RouterConfig(cache_salt_secret=SECRET), "tenant-b") == 0
    assert matched_blocks(RouterConfig()) == 0  # no secret: salted prompts match nothing


@pytest.mark.parametrize("given", [from_yaml, from_env, from_record])
def test_the_hex_the_cluster_record_holds_keys_salted_prompts_as_the_replicas(tmp_path, given):
    config = given(tmp_path, SECRET.hex())
    assert config.cache_salt_secret == SECRET
    assert matched_blocks(config) == 3


@pytest.mark.parametrize("given", [from_yaml, from_env])
@pytest.mark.parametrize("text", [
    base64.b64encode(SECRET).decode(),  # base64 of the right bytes: not the form
    SECRET.hex()[:-2],  # 31 bytes
    SECRET.hex() + "00",  # 33 bytes
    "zz" * 32,  # not hex
    SEED.decode(),  # the hash seed itself
])
def test_a_secret_in_another_form_is_refused_naming_the_hex_form(tmp_path, given, text):
    with pytest.raises(ConfigError) as caught:
        given(tmp_path, text)
    message = str(caught.value)
    assert "router.cache_salt_secret" in message and VARIABLE in message
    assert "64 hex characters" in message and "router_secrets.cache_salt_secret" in message
    assert text not in message  # a secret is never echoed


def test_a_router_config_built_in_code_refuses_a_secret_of_the_wrong_length():
    with pytest.raises(ValueError, match="32-byte salt secret, got 64 bytes"):
        RouterConfig(cache_salt_secret=SECRET.hex().encode())


def test_serve_refuses_a_salt_secret_in_its_config_as_it_derives_its_own(tmp_path):
    from kvmesh.cluster.config.trees import SERVE_SCHEMA

    path = tmp_path / "serve.yaml"
    path.write_text(f"router:\n  cache_salt_secret: {SECRET.hex()}\n")
    with pytest.raises(ConfigError, match="router.cache_salt_secret cannot be set in this command: serve derives it"):
        load(SERVE_SCHEMA, path, env={})


def test_the_salt_secret_check_tells_secrets_apart_and_is_no_salts_digest():
    from kvmesh.kvcache.hashing import salt_key, salt_secret_check

    check = salt_secret_check(SECRET)
    assert check == salt_secret_check(cache_salt_secret(SEED)) and salt_secret_check(None) is None
    assert check != salt_secret_check(cache_salt_secret(b"another cluster's seed"))
    assert SECRET.hex()[:16] not in check and check not in salt_key("kvmesh/cache-salt-check/v1", SECRET)
