"""Fixtures of the security suite: the live clusters an attacker faces, the listener, the reference.

``kv_cluster`` is one ``kvmesh serve`` of stories260K on the session's Ray: a prefill and a decode replica, KV
transfer on both (splits, and the same /kv routes and ``kv_transfer_params`` a peer pull uses), with a small
KV pool (so pinning it is quick). It is parametrized over the router's ``api_key`` (``open``: none;
``api_key``: tenants need one). ``noisy_fleet`` is the noisy-neighbour suites' router and two replica processes
with two tenants (noisy_fleet.py). Each is started once and kept while the test files that follow use it, so files
run one after another share it (tests/file_order.py hands them out together: its ``SHARED_STARTS``).

``record(attack, **numbers)`` keeps what an attack achieved before the test asserts it was refused: with
``KVMESH_SECURITY_RECORD=<file>`` each is appended to it as a JSON line (how the "before" numbers of the
issue were taken).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable

import pytest

from ..cluster.live_cluster import start_cluster
from ..conftest import CHAT_TEMPLATE
from .harness import KVCluster
from .listener import Listener
from .noisy_fleet import start_fleet

KV_POOL = "4MiB"
"""The replicas' KV cache: about 200 blocks of stories260K (1,280 bytes a token)."""


@pytest.fixture(scope="session")
def nixl():
    from kvmesh.replica.kv_transfer.nixl_agent import nixl_missing

    if (why := nixl_missing()) is not None:
        pytest.skip(why)


ALIVE: dict[tuple[str, str], Callable[[], None]] = {}
"""(fixture, parameter) -> how to stop what it started: the shared starts of the module doc, kept while the process
runs test files that use that fixture."""
STARTED: dict[tuple[str, str], object] = {}
FILES_USING = pytest.StashKey[dict]()
"""Fixture -> the session's test files that use it."""


def _shared(name: str, param: str, start: Callable[[], object], stop: Callable[[object], None]) -> object:
    if (name, param) not in STARTED:
        STARTED[name, param] = started = start()
        ALIVE[name, param] = lambda: stop(started)
    return STARTED[name, param]


@pytest.fixture(scope="module", params=["open", "api_key"])
def kv_cluster(request, stories_path, nixl, ray_session, tmp_path_factory):
    """See the module doc: the parameter's cluster, started on first use and kept while the tests this process
    runs next are in files that use one (``pytest_runtest_teardown`` stops them), so such files that follow each other
    share both."""
    return _shared("kv_cluster", request.param,
                   lambda: _start_kv_cluster(request.param, stories_path, tmp_path_factory),
                   lambda cluster: cluster.serve.stop())


@pytest.fixture(scope="module")
def noisy_fleet(stories_path, tmp_path_factory):
    """See the module doc: the noisy-neighbour fleet, shared as ``kv_cluster`` is."""
    return _shared("noisy_fleet", "",
                   lambda: start_fleet(stories_path, tmp_path_factory.mktemp("noisy"), CHAT_TEMPLATE),
                   lambda fleet: fleet.stop())


SPLIT_BY_TOKENS = {"pd_ttft_slack_s": None}
"""The kv_cluster's router splits every long prompt by the token rules alone: priced by the replicas' measured rates,
a noisy machine's slow measurement skips a split the tests rely on (the price is tested in tests/router/)."""


def _start_kv_cluster(param: str, stories_path, tmp_path_factory) -> KVCluster:
    api_key = secrets.token_urlsafe(16) if param == "api_key" else None
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)  # stories260K ships none; the chat tests need one
    serve = start_cluster(
        stories_path, tmp_path_factory, f"sec-{param}",
        engine={"model": str(stories_path), "kv_cache_memory": KV_POOL, "max_num_batched_tokens": 512},
        replicas={"num_replicas": 1, "num_prefill_replicas": 1},
        router={"transfers": SPLIT_BY_TOKENS, **({"api_key": api_key} if api_key else {})},
        frontend={"chat_template": str(template)})
    return KVCluster(serve, api_key)


@pytest.hookimpl(tryfirst=True)  # before the session's fixtures (its Ray) are torn down after the last test
def pytest_runtest_teardown(item, nextitem):
    """Stops each shared start once the next test of this process is in a file that does not use its fixture (or
    none follows)."""
    for name, param in list(ALIVE):
        if nextitem is None or _file(nextitem) not in _files_using(item.session, name):
            STARTED.pop((name, param))
            ALIVE.pop((name, param))()


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


def _files_using(session, name: str) -> set[str]:
    if FILES_USING not in session.stash:
        session.stash[FILES_USING] = {}
    if name not in session.stash[FILES_USING]:
        session.stash[FILES_USING][name] = {_file(i) for i in session.items if name in i.fixturenames}
    return session.stash[FILES_USING][name]


@pytest.fixture(scope="session")
def tokenizer(stories_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(stories_path))


@pytest.fixture(scope="session")
def reference(stories_path):
    """Greedy text of one engine, no cluster: the model's own answer to a prompt."""
    from kvmesh.replica.llm import LLM
    from kvmesh.replica.serving.sampling_params import SamplingParams

    llm = LLM(str(stories_path), kv_cache_memory=4 << 20, max_num_batched_tokens=512)

    def generate(prompt: list[int], max_tokens: int = 16) -> str:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate([prompt], params)[0].text

    return generate


@pytest.fixture
def listener():
    """A stranger's URL on 127.0.0.1 that records every call (listener.py)."""
    server = Listener().start()
    yield server
    server.stop()


@pytest.fixture
def record(request):
    """``record(attack, **numbers)``: what the attack achieved, kept before the test asserts (module doc)."""
    path = os.environ.get("KVMESH_SECURITY_RECORD")

    def keep(attack: str, **numbers) -> None:
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, "attack": attack, **numbers}, default=str) + "\n")

    return keep
