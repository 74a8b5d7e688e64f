"""The KV connectors an engine gets unless told otherwise (kv_connector.py)."""

from __future__ import annotations

from collections.abc import Sequence

from kvmesh.replica.engine.kv_connector import KVConnectorFactory


def default_kv_connectors() -> Sequence[KVConnectorFactory]:
    """KV transfers between replicas (pulls and leases; idle until the replica turns KV transfer on)."""
    from kvmesh.replica.engine.kv_transfers import EngineKVTransfers

    return (EngineKVTransfers,)
