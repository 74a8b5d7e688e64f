"""Load-generator test fixtures: the fake replica (``kvmesh.cluster.measure.benchmarks.support.fake_replica``) on a
thread.

It streams ``max_tokens`` chunks ``token_delay`` apart and reports ``usage`` with
``prompt_tokens_details.cached_tokens`` from a real prefix cache of 16-token blocks (token-id prompts
as sent, text prompts one token per word), so cached shares are predictable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from kvmesh.cluster.measure.benchmarks.support.fake_replica import FakeReplica, Faults
from kvmesh.cluster.measure.benchmarks.support.fake_thread import RunningFake, serve_in_thread
from kvmesh.cluster.measure.benchmarks.support.prefix_cache import PrefixCache

BLOCK = 16


def fake_server_replica(token_delay: float = 0.001, fail_every: int = 0) -> FakeReplica:
    return FakeReplica("fake", model="fake-model", cache=PrefixCache("fake", BLOCK, 4096, publish=False),
                       faults=Faults(token_delay=token_delay, fail_every=fail_every), answer_max_tokens=True,
                       keep_bodies=True, words=True)


@pytest.fixture
def fake_server() -> Iterator[RunningFake]:
    with serve_in_thread(fake_server_replica()) as srv:
        yield srv


@pytest.fixture
def make_fake_server() -> Iterator:
    """Factory for servers with options (``fail_every``, ``token_delay``); closed at teardown."""
    with ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(serve_in_thread(fake_server_replica(**kwargs)))
