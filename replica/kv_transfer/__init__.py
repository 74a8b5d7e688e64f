"""kvmesh.replica.kv_transfer: KV blocks moved between replicas by block id (NIXL; an in-process fake for tests)."""
