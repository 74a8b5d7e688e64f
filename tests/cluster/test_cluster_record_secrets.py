"""A cluster's record keeps what another router needs to stand in front of its replicas, for its user only."""

from __future__ import annotations

import os

from kvmesh.cluster.admin_key import RouterSecrets, publish, running_record
from kvmesh.events.config import SubscriberConfig
from kvmesh.router.config import RouterConfig


def test_the_record_carries_the_routers_secrets_readable_by_its_user_only(tmp_path):
    own = RouterConfig(port=0, block_size=8, internal_key="internal-key-of-the-cluster-0123456789",
                       cache_salt_secret=b"\x01\x02salt" + bytes(26),
                       events=SubscriberConfig(curve_server_key="S" * 40, curve_public_key="P" * 40,
                                               curve_secret_key="X" * 40))
    path = publish("http://127.0.0.1:8123", "admin-key", tmp_path, router_secrets=RouterSecrets.of(own))
    assert os.stat(path).st_mode & 0o077 == 0
    record = running_record("http://localhost:8123", tmp_path)
    assert record is not None and "internal-key" not in repr(record) and "X" * 40 not in repr(record.router_secrets)
    other = record.router_secrets.apply(RouterConfig(port=0, policy="round_robin"))
    assert (other.internal_key, other.cache_salt_secret, other.block_size) == (own.internal_key, own.cache_salt_secret,
                                                                               8)
    assert (other.events.curve_server_key, other.events.curve_public_key, other.events.curve_secret_key) == (
        "S" * 40, "P" * 40, "X" * 40)
    assert other.policy == "round_robin"


def test_a_record_without_secrets_reads_as_before(tmp_path):
    publish("http://127.0.0.1:8124", "admin-key", tmp_path)
    assert running_record("http://127.0.0.1:8124", tmp_path).router_secrets is None
