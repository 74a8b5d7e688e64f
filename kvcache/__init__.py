"""kvmesh.kvcache: block hashing, the block pool, free queue, eviction policies, the KV cache manager.

Pure Python + xxhash (no torch). Import the submodules you need, e.g.
``from kvmesh.kvcache.kv_cache_manager import KVCacheManager``.
"""
