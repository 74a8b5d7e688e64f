"""The router keys an adapter's requests with the identity of its weights that the replicas report, so its keys
are the router keys of the replica's own BlockStored events (events and router agree on the identity); an adapter
loaded again from other weights moves to the new identity and stops matching the old blocks. One adapter name
belongs to one base model per router: loading it for another base is a 409 naming the base that holds it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kvmesh.events.schema import BlockStored
from kvmesh.replica.config import EngineConfig
from kvmesh.replica.engine.engine_request import EngineRequest
from kvmesh.replica.engine.llm_engine import LLMEngine
from kvmesh.replica.serving.errors import ProtocolError
from kvmesh.replica.serving.lora_request import LoRARequest
from kvmesh.replica.serving.sampling_params import SamplingParams
from kvmesh.replica.worker.fake_runner import FakeModelRunner
from kvmesh.router.control.adapter_loads import AdapterLoads
from kvmesh.router.replicas.replica import Replica
from kvmesh.router.routing.index import PrefixIndex
from kvmesh.router.routing.keys import RouterKeyHasher
from kvmesh.router.routing.model_pools import AdapterLoadError, ModelCatalog, ServedModels

BS = 4
PROMPT = list(range(10, 42))  # 8 full blocks


def engine_with_events(events: list) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model="fake", block_size=BS, hash_seed=b"s", enable_lora=True, max_loras=2,
                                    max_lora_rank=8), model_runner=FakeModelRunner(num_kv_blocks=64, block_size=BS),
                       skip_tokenizer_init=True)
    pool = engine.kv_cache_manager.block_pool
    sink = pool.event_sink
    pool.event_sink = lambda event: (events.append(event), sink and sink(event))
    return engine


def run(engine: LLMEngine, request_id: str, lora: LoRARequest) -> None:
    engine.add_request(EngineRequest(request_id, PROMPT, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
                       lora_request=lora))
    for _ in range(50):
        if any(out.finished for out in engine.step()):
            return
    raise AssertionError("the request never finished")


def routed_match(engine: LLMEngine, events: list, catalog: ModelCatalog) -> int:
    """Blocks of PROMPT the router's keys for an ``x`` request find in the index fed by the replica's events."""
    catalog.set_adapters(catalog.replicas.get("r0"), engine.loras.load([]).adapters, engine.loras.load([]).identities)
    pool = catalog.pool("x")
    index = PrefixIndex(hasher=RouterKeyHasher(BS), predict_ttl_s=0.0)
    index.add_replica("r0")
    index.apply("r0", events)
    keys = index.hasher.keys(PROMPT, None, pool.lora_name, pool.lora_identity)
    return index.match(keys).get("r0", 0)


def test_the_routers_keys_of_an_adapter_request_are_those_of_the_replicas_events():
    events: list = []
    engine = engine_with_events(events)
    engine.add_lora(LoRARequest("x", 1, "/adapters/old"))
    run(engine, "a", LoRARequest("x", 1, "/adapters/old"))
    identity = engine.loras.load([]).identities["x"]
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored and all(list(keys) == ["x", identity] for e in stored for keys in e.extra_keys)
    catalog = ModelCatalog()
    catalog.set_served(Replica("r0", healthy=True), ServedModels("stories", None, {"x": "/adapters/old"}))
    assert routed_match(engine, events, catalog) == len(PROMPT) // BS
    assert catalog.pool("x").lora_identity == identity

    engine.remove_lora("x")  # loaded again from other weights: the router's keys move with the identity
    engine.add_lora(LoRARequest("x", 2, "/adapters/new"))
    old_blocks = list(events)
    assert routed_match(engine, old_blocks, catalog) == 0  # the old weights' blocks match no more
    run(engine, "b", LoRARequest("x", 2, "/adapters/new"))
    assert routed_match(engine, events, catalog) == len(PROMPT) // BS


def test_without_the_identity_the_keys_would_miss_the_replicas_blocks():
    """The check above can fail: keys by name alone (the router before identities) match none of the blocks."""
    events: list = []
    engine = engine_with_events(events)
    engine.add_lora(LoRARequest("x", 1, "/adapters/old"))
    run(engine, "a", LoRARequest("x", 1, "/adapters/old"))
    index = PrefixIndex(hasher=RouterKeyHasher(BS), predict_ttl_s=0.0)
    index.add_replica("r0")
    index.apply("r0", events)
    assert index.match(index.hasher.keys(PROMPT, None, "x")) == {}


def test_the_identity_most_holders_report_keys_the_pool():
    catalog = ModelCatalog()
    for rid, ident in (("r0", "aaa"), ("r1", "bbb"), ("r2", "bbb")):
        catalog.set_served(Replica(rid, healthy=True), ServedModels("stories", None, {"x": "/x"}))
        catalog.set_adapters(catalog.replicas.get(rid), ["x"], {"x": ident})
    assert catalog.pool("x").lora_identity == "bbb"
    catalog.forget_adapter("x")
    assert all(not s.identities for s in catalog.served.values())


def test_reading_a_replicas_model_list_again_keeps_the_identities_its_load_reported():
    """An adapter loaded at runtime changes every replica's ``/load`` adapters, and the router reads each one's
    ``/v1/models`` again (router/control/models.py ``on_load``): the identities of the adapters it served already
    key their requests meanwhile, or those requests match no block anywhere until the next ``/load``."""
    catalog = ModelCatalog()
    for rid in ("r0", "r1"):
        catalog.set_served(Replica(rid, healthy=True), ServedModels("stories", None, {"x": "/x"}))
        catalog.set_adapters(catalog.replicas.get(rid), ["x"], {"x": "aaa"})
    for rid in ("r0", "r1"):
        catalog.set_served(catalog.replicas.get(rid), ServedModels("stories", None, {"x": "/x", "late": "/late"}))
    assert catalog.pool("x").lora_identity == "aaa"
    assert catalog.pool("late").lora_identity is None  # not reported yet: its first /load says it
    catalog.set_served(catalog.replicas.get("r0"), ServedModels("stories", None, {"late": "/late"}))
    assert "x" not in catalog.served["r0"].identities  # an adapter it no longer serves takes its identity along


def test_a_replica_that_turns_healthy_keys_its_adapters_with_the_identities_of_its_last_load():
    """The probe reads ``/load`` before the replica's ``/v1/models`` (``learn``, when it turns healthy): the
    identities of that ``/load`` key its adapters' requests from then on, not from the next poll."""
    from kvmesh.replica.serving.load_report import LoRALoad
    from kvmesh.router.config import RouterConfig
    from kvmesh.router.control.models import RouterModels
    from kvmesh.router.replicas.replica_set import ReplicaSet
    from kvmesh.router.replicas.spec import ReplicaSpec

    cards = b'{"data": [{"id": "stories", "root": "/m"}, {"id": "x", "parent": "stories", "root": "/x"}]}'

    async def fetch(method, url, path, timeout_s, headers=None):
        assert (method, path) == ("GET", "/v1/models")
        return 200, {}, cards

    calls = SimpleNamespace(control=SimpleNamespace(fetch=fetch), headers=dict)
    models = RouterModels(RouterConfig(), ReplicaSet(), None, object(), calls)
    models.frontends["stories"] = object()  # its tokenizer: not what this test reads
    replica = models.replicas.add(Replica("r0", healthy=True, spec=ReplicaSpec("http://r0")))
    replica.load.lora = LoRALoad(enabled=True, adapters={"x": 10}, identities={"x": "aaa"})
    models.on_load(replica, SimpleNamespace(lora=replica.load.lora))  # before it serves anything: nothing to key
    asyncio.run(models.learn(replica, None))
    assert models.catalog.pool("x").lora_identity == "aaa"


class FakeRuntime:
    """What AdapterLoads reads: a catalog of two bases (its replicas healthy) and replicas that answer loads as
    ``answer`` says."""

    def __init__(self, answer) -> None:
        self.models = SimpleNamespace(catalog=ModelCatalog())
        self.models.catalog.set_served(Replica("s0", healthy=True), ServedModels("stories", None, {"a1": "/a1"}))
        self.models.catalog.set_served(Replica("t0", healthy=True), ServedModels("tiny", None, {}))
        self.answer = answer


def admin_load(runtime: FakeRuntime, name: str, path: str, base: str | None):
    loads = AdapterLoads(runtime.models.catalog.replicas, None, runtime.models)

    async def load(rid, n, p):
        return runtime.answer(rid)

    loads.load = load
    return asyncio.run(loads.admin_load(name, path, base))


def test_loading_an_adapter_name_for_another_base_is_a_409_naming_the_base_holding_it():
    runtime = FakeRuntime(lambda rid: None)
    with pytest.raises(ProtocolError) as e:
        admin_load(runtime, "a1", "/other/a1", "tiny")
    assert e.value.status_code == 409 and "`stories`" in e.value.message and "a1" in e.value.message
    assert runtime.models.catalog.adapters()["a1"] == ("stories", "/a1")  # the stories a1 is kept
    assert admin_load(runtime, "a2", "/a2", "tiny")["loaded_on"] == ["t0"]


def test_an_adapter_every_replica_refuses_is_their_400_not_a_502():
    def refuse(rid):
        raise AdapterLoadError(f"replica {rid} answered with HTTP 400: tensor 'B' holds NaN or infinite values", 400)

    with pytest.raises(ProtocolError) as e:
        admin_load(FakeRuntime(refuse), "bad", "/bad", "tiny")
    assert e.value.status_code == 400 and "tensor 'B' holds NaN" in e.value.message
