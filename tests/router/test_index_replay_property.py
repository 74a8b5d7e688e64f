"""Property: replaying a real BlockPool's event stream into the index reproduces its cached set.

A ``KVCacheManager`` (the replica's real prefix cache) is driven by random requests -- shared
prefixes, salts, LoRA adapters, frees, evictions under memory pressure, prefix-cache resets, restarts -- and its
events feed a ``PrefixIndex``. Whenever the stream is complete, the index holds exactly the
replica's cached block hashes and matches every prompt as the replica's own lookup would. Lost
events (a gap) leave it wrong until a snapshot ``[AllBlocksCleared, *snapshot]`` arrives, after
which it converges again.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.events.schema import AllBlocksCleared
from kvmesh.kvcache.hashing import RequestBlockHasher, cache_salt_secret, external_hash
from kvmesh.kvcache.interfaces import TokenRequest as Req
from kvmesh.kvcache.kv_cache_manager import KVCacheManager
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import RouterKeyHasher

BS = 4
PREFIXES = [[7] * 12, [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 8, 8, 7, 7]]
SALTS = [None, "tenant-a"]
LORAS = [None, "tiny", "sql"]
"""Adapters: the engine keys every block of an adapter's prompt with its name; the router must too."""


class Replica:
    def __init__(self, num_blocks: int):
        self.events: list = []
        self.num_blocks = num_blocks
        self.restart()

    def restart(self):
        self.manager = KVCacheManager(self.num_blocks, BS, hash_seed=b"secret", event_sink=self.events.append)
        self.active: dict[str, Req] = {}
        self.events.append(AllBlocksCleared())  # what a fresh replica publishes first

    def run(self, req: Req) -> None:
        computed, n = self.manager.get_computed_blocks(req)
        if self.manager.allocate_slots(req, req.num_tokens - n, n, computed) is not None:
            self.active[req.request_id] = req

    def cached_hashes(self) -> set[int]:
        return {external_hash(h) for h in self.manager.block_pool.cached_block_hash_to_block}

    def expected_match(self, req: Req) -> int:
        hashes = RequestBlockHasher(BS, self.manager.none_hash, req.cache_salt, req.lora_name).extend(req.all_token_ids)
        cached = self.manager.block_pool.cached_block_hash_to_block
        n = 0
        while n < len(hashes) and hashes[n] in cached:
            n += 1
        return n


op = st.one_of(
    st.tuples(st.just("run"), st.integers(0, len(PREFIXES) - 1), st.lists(st.integers(0, 30), max_size=14),
              st.sampled_from(SALTS), st.sampled_from(LORAS)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("reset")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("gap"), st.integers(1, 5)),
    st.tuples(st.just("snapshot")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), num_blocks=st.integers(6, 24))
def test_index_converges_to_replica_cached_set(ops, num_blocks):
    replica = Replica(num_blocks)
    hasher = RouterKeyHasher(BS, salt_secret=cache_salt_secret(b"secret"))  # what serve gives its router
    index = PrefixIndex(hasher=hasher, predict_ttl_s=0)
    prompts: list[Req] = []
    in_gap = False
    for i, (kind, *args) in enumerate(ops):
        if kind == "run":
            prefix, suffix, salt, lora = args
            req = Req(f"r{i}", PREFIXES[prefix] + suffix, cache_salt=salt, lora_name=lora)
            prompts.append(req)
            replica.run(req)
        elif kind == "free" and replica.active:
            rid = sorted(replica.active)[args[0] % len(replica.active)]
            replica.manager.free(replica.active.pop(rid))
        elif kind == "reset" and not replica.active and replica.manager.reset_prefix_cache():
            pass
        elif kind == "restart":
            replica.restart()
        elif kind == "gap":
            del replica.events[: args[0]]  # lost on the wire
            in_gap = True
        elif kind == "snapshot":
            replica.events[:] = [AllBlocksCleared(), *replica.manager.block_pool.snapshot_events()]
            in_gap = False
        if not in_gap or kind == "snapshot":
            index.apply("r", replica.events)
        replica.events.clear()
        if not in_gap:
            assert index.cached_hashes("r") == replica.cached_hashes()
            assert index.num_blocks("r") == len(replica.cached_hashes())
            for req in prompts[-5:]:
                got = index.match(hasher.keys(req.all_token_ids, req.cache_salt, req.lora_name)).get("r", 0)
                assert got == replica.expected_match(req)
