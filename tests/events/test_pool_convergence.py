"""A real block pool's event stream: every kind of subscriber ends with exactly the pool's cached set.

The pool (kvmesh.kvcache) runs a random serving workload (shared prefixes, decode, preemption,
frees, prefix-cache resets); each engine step's events are one published batch, some of which
the network "loses". Followers that were there from the start (one with a 1-message receive HWM
and a slow consumer), joined late, or were restarted mid-stream must all hold the pool's cached
blocks at the end.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import pytest
from events_testkit import DroppingSocket, Follower, make_publisher, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvmesh.events.config import PublisherSource, SubscriberConfig
from kvmesh.events.schema import DEVICE_MEDIUM
from kvmesh.kvcache.hashing import external_hash
from kvmesh.kvcache.interfaces import TokenRequest
from kvmesh.kvcache.kv_cache_manager import KVCacheManager

pytestmark = pytest.mark.slow  # hypothesis drives a live subscriber through many pools (tens of seconds)

BLOCK_SIZE = 4
CONFIG = SubscriberConfig(replay_timeout=1.0, snapshot_timeout=1.0, idle_probe_interval=0.2)


@dataclass(eq=False)
class Req(TokenRequest):
    """A cache request plus what this workload tracks."""

    decode_left: int = 0
    blocks: list = field(default_factory=list)


class Workload:
    """Drives a KVCacheManager like a scheduler would; one ``step`` = one published batch."""

    def __init__(self, rng: random.Random, num_blocks: int) -> None:
        self.rng = rng
        self.events: list = []
        self.kv = KVCacheManager(num_blocks, BLOCK_SIZE, hash_seed=b"test-seed", event_sink=self.events.append)
        self.prefixes = [[rng.randrange(1, 500) for _ in range(rng.choice((4, 8, 12)))] for _ in range(4)]
        self.running: list[Req] = []
        self.n = 0

    def step(self) -> list:
        rng, kv = self.rng, self.kv
        if rng.random() < 0.6:
            self.n += 1
            salt = "tenant-b" if rng.random() < 0.2 else None
            prompt = rng.choice(self.prefixes) + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 10))]
            req = Req(f"r{self.n}", prompt, cache_salt=salt, decode_left=rng.randrange(0, 8))
            computed, num_computed = kv.get_computed_blocks(req)
            if kv.allocate_slots(req, req.num_tokens - num_computed, num_computed, computed) is not None:
                req.num_computed_tokens = req.num_tokens
                self.running.append(req)
        for req in list(self.running):
            if req.decode_left <= 0 or rng.random() < 0.1:
                self.running.remove(req)
                kv.free(req)
                continue
            req.all_token_ids.append(rng.randrange(1, 500))
            req.decode_left -= 1
            if kv.allocate_slots(req, 1) is None:  # no room: preempt
                self.running.remove(req)
                kv.free(req)
            else:
                req.num_computed_tokens += 1
        if not self.running and rng.random() < 0.05:
            kv.reset_prefix_cache()
        out, self.events[:] = list(self.events), []
        return out

    def cached(self) -> set:
        return {(DEVICE_MEDIUM, external_hash(h)) for h in self.kv.block_pool.cached_block_hash_to_block}


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))  # ~10 s each
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(12, 48), drop_every=st.integers(3, 9))
def test_late_dropped_and_restarted_followers_end_with_the_pools_cached_set(seed, num_blocks, drop_every):
    rng = random.Random(seed)
    work = Workload(rng, num_blocks)
    pub = make_publisher(buffer_steps=rng.choice((4, 64)))  # small buffers force snapshot fallbacks
    pub._io._pub = DroppingSocket(pub._io._pub, drop=lambda seq: seq % drop_every == 1)
    src = PublisherSource("r0", pub.endpoint, pub.replay_endpoint)
    followers: list[Follower] = []
    try:
        lossy = Follower([src], CONFIG).start()          # from the start, but loses batches
        tiny_cfg = SubscriberConfig(replay_timeout=1.0, snapshot_timeout=1.0, idle_probe_interval=0.2, rcvhwm=1)
        tiny = Follower([src], tiny_cfg, slow_first=3, delay=0.05).start()  # tiny HWM, slow consumer
        followers += [lossy, tiny]
        assert wait_for(lambda: lossy.sub.stats["r0"].snapshots == 1 and tiny.sub.stats["r0"].snapshots == 1)
        assert lossy.joined("r0", pub, followers=2) and tiny.joined("r0", pub, followers=2)
        steps = 120
        restarted = late = None
        for i in range(steps):
            if i == steps // 3:
                restarted = Follower([src], CONFIG).start()
                followers.append(restarted)
            if i == steps // 2:
                restarted.close()
                late = Follower([src], CONFIG).start()   # joins late
                followers.append(late)
            if i == 2 * steps // 3:
                restarted = Follower([src], CONFIG).start()  # the restart of the closed one
                followers.append(restarted)
            events = work.step()
            if events:
                pub.publish(events)
            time.sleep(0.002)  # engine steps take time; followers see a live stream
        expected = work.cached()
        for name, f in (("lossy", lossy), ("tiny-hwm", tiny), ("late", late), ("restarted", restarted)):
            assert f.converges("r0", pub, timeout=10), f"{name}: {f.sub.stats['r0']}"
            assert f.states["r0"].keys() == expected, name
        assert pub._io.shadow.keys() == expected
        assert lossy.sub.stats["r0"].gaps >= 1
    finally:
        for f in followers:
            f.close()
        pub.close()
